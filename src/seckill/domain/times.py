"""Time conversions: Redis and the scripts count milliseconds since the Unix epoch, SQL and the
API speak aware UTC datetimes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ms_to_datetime(ms: int) -> datetime:
    """Milliseconds since the Unix epoch as an aware UTC datetime, exactly (through a float,
    a far date's milliseconds came back a microsecond short)."""
    return _EPOCH + timedelta(milliseconds=ms)


def datetime_to_ms(moment: datetime) -> int:
    """An aware datetime as milliseconds since the Unix epoch, rounded to the nearest."""
    return round(moment.timestamp() * 1000)
