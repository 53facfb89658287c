"""Dead letters: stream entries a consumer group gave up on, kept with why until a person
replays them (lands or delivers them again, once the cause is fixed) or drops them.

Two groups give up on entries. The persister's are rows in SQL (a copy goes on the item's
dead-letter stream too); a bridge's live only on that stream, since a bridge works without SQL.
Both read as one record, ``DeadLetter``, and each dead-letter stream entry is the entry's own
fields plus ``DEAD_FIELDS``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

PERSISTER_GROUP = "persister"
"""The persister's consumer group on every item stream."""

DEAD_FIELDS = ("dead_entry_id", "dead_group", "dead_error", "dead_deliveries")
ERROR_CHARS = 1000  # an error is kept this long at most: enough to say why, not a whole trace


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A stream entry a group gave up on, with why, and whether a person settled it since."""

    # The persister's: its SQL row id ("17"). A bridge's: item, shard and its id on the
    # dead-letter stream ("7:0:1732650000000-0").
    id: str
    group: str
    stream: str  # the item stream the entry was on
    entry_id: str
    payload: dict[str, str]
    error: str
    deliveries: int
    died_at: datetime
    replayed_at: datetime | None = None
    dropped_at: datetime | None = None

    @property
    def pending(self) -> bool:
        """Nobody replayed or dropped it yet."""
        return self.replayed_at is None and self.dropped_at is None


def dead_letter_fields(
    payload: dict[str, str], *, entry_id: str, group: str, error: str, deliveries: int
) -> dict[str, str]:
    """The dead-letter stream entry for an entry ``group`` gave up on."""
    return {
        **payload,
        "dead_entry_id": entry_id,
        "dead_group": group,
        "dead_error": error[:ERROR_CHARS],
        "dead_deliveries": str(deliveries),
    }


def read_dead_letter(
    letter_id: str, fields: dict[str, str], *, stream: str, died_at: datetime
) -> DeadLetter:
    """A dead-letter stream entry as a record (one written before groups were named in it is the
    persister's)."""
    return DeadLetter(
        id=letter_id,
        group=fields.get("dead_group", PERSISTER_GROUP),
        stream=stream,
        entry_id=fields.get("dead_entry_id", ""),
        payload={k: v for k, v in fields.items() if k not in DEAD_FIELDS},
        error=fields.get("dead_error", ""),
        deliveries=int(fields.get("dead_deliveries", 0)),
        died_at=died_at,
    )
