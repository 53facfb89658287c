"""The waiting room as a buyer sees it: where they stand, how many are ahead, and how long it may
take. Plain values and one rule, no I/O (the queue itself lives in Redis: engine.queues).

Every buyer who joins an item's queue has a position: those who joined before the sale started
are placed in a random order at the start (position 0 until then), everyone after in the order
they came. The inlet moves one frontier forward, ``admitted_up_to``: every position up to it may
take a purchase ticket.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum


class QueueState(StrEnum):
    WAITING = "waiting"  # not yet let in
    ADMITTED = "admitted"  # may take a ticket and buy
    SOLD_OUT = "sold_out"  # nothing left and no hold that could come back: the wait is over
    ENDED = "ended"  # the sale is over


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueFront:
    """One reading of an item's queue and stock, what every buyer's standing is worked out from."""

    starts_at_ms: int
    ends_at_ms: int
    sealed: bool  # the pre-start joiners have their positions (the sale has started)
    length: int  # positions given so far (pre-start joiners count once sealed)
    admitted_up_to: int
    available: int  # units left, over every shard
    held: int  # units held, unpaid: they may come back
    admissions_per_s: float | None  # the inlet's recent pace (None: it has not moved lately)

    @property
    def sold_out(self) -> bool:
        return self.available == 0 and self.held == 0


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueStanding:
    """What ``GET /api/v1/items/{id}/queue`` answers a buyer."""

    position: int | None  # None: drawn at the start
    ahead: int | None  # positions before this one not yet let in
    admitted_up_to: int
    estimated_wait_s: int | None  # None: unknown (not started, or nothing moving)
    state: QueueState


def standing(position: int, front: QueueFront, now_ms: int) -> QueueStanding:
    """The standing of the buyer at ``position`` (0: not drawn yet) at ``now_ms``.

    The truth comes first: an ended sale or a sold-out item ends every wait, admitted or not
    (held units may come back, so an item with holds is not sold out yet).
    """
    admitted = front.admitted_up_to
    if now_ms >= front.ends_at_ms:
        state = QueueState.ENDED
    elif front.sold_out:
        state = QueueState.SOLD_OUT
    elif 0 < position <= admitted:
        state = QueueState.ADMITTED
    else:
        state = QueueState.WAITING
    if position == 0:
        return QueueStanding(
            position=None,
            ahead=None,
            admitted_up_to=admitted,
            estimated_wait_s=max(0, math.ceil((front.starts_at_ms - now_ms) / 1000))
            if state is QueueState.WAITING
            else None,
            state=state,
        )
    ahead = max(0, position - 1 - admitted)
    wait: int | None = 0 if state is not QueueState.WAITING else None
    pace = front.admissions_per_s
    if state is QueueState.WAITING and pace and front.available > 0:
        wait = math.ceil((ahead + 1) / pace)
    return QueueStanding(
        position=position,
        ahead=ahead,
        admitted_up_to=admitted,
        estimated_wait_s=wait,
        state=state,
    )
