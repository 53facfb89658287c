"""Time conversions: Redis and the scripts count milliseconds since the Unix epoch, SQL and the
API speak aware UTC datetimes."""

from __future__ import annotations

from datetime import UTC, datetime


def ms_to_datetime(ms: int) -> datetime:
    """Milliseconds since the Unix epoch as an aware UTC datetime."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def datetime_to_ms(moment: datetime) -> int:
    """An aware datetime as milliseconds since the Unix epoch, rounded to the nearest."""
    return round(moment.timestamp() * 1000)
