"""The waiting room: buyers join an item's queue, watch their standing, and are let in to take a
purchase ticket when their turn comes.

Only items created with a waiting room (``waiting_room`` on the item, loaded onto its head) have
one: for another item, joining raises ``NoWaitingRoom``, and the ticket office lets its buyers
take a ticket directly.

* ``join`` puts the buyer in the queue (once: joining again answers the same place) and answers
  a signed pass (``seckill.security.passes``) with their standing.
* ``standing`` answers a pass's holder where they stand, without reading their place from Redis:
  the pass carries the position, and the queue's front (its frontier, length, pace, and the
  units left) is read once per ``front_ttl_ms`` per item by this process for all its buyers. A
  pre-start pass (position 0) is placed once after the start, and answered with a new pass.
* ``admit`` is the ``TicketGate`` of the items with a room: the ticket office lets a buyer have
  a ticket only once their position is within the frontier (read fresh, one script call), so
  the purchase path stays as it is.

The inlet (``seckill.workers.inlet``) moves the frontier.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from seckill.domain.outcomes import Outcome
from seckill.domain.queue import QueueFront, QueueStanding, QueueState, standing
from seckill.engine.queues import Admission, Queues
from seckill.observability import metrics
from seckill.security.passes import PassCodec, QueuePass
from seckill.services.items import UnknownItem
from seckill.services.tickets import ADMITTED, Clock, GateDecision, SaleClosed, wall_clock_ms

# A pass outlives the sale by this much, so a buyer still polling after the end is told it ended.
PASS_GRACE_MS = 3_600_000


class NoWaitingRoom(Exception):
    """The item sells without a waiting room: take a ticket directly."""


@dataclass(frozen=True, slots=True)
class Standing:
    """A buyer's standing, and the pass to send next time (a new one when it changed)."""

    standing: QueueStanding
    pass_text: str
    queue_pass: QueuePass


@dataclass(frozen=True, slots=True)
class QueueReport:
    """An item's queue for its operators: the front, and every step the inlet took."""

    front: QueueFront
    admissions: list[Admission]


async def queue_report(queues: Queues, item_id: int) -> QueueReport:
    """``UnknownItem`` for an item not loaded."""
    front = await queues.front(item_id)
    if front is None:
        raise UnknownItem(f"item {item_id} is not on sale")
    return QueueReport(front, await queues.admissions(item_id))


class WaitingRoom:
    """The waiting rooms as one API process serves them (see the module's docstring)."""

    def __init__(
        self,
        *,
        queues: Queues,
        codec: PassCodec,
        open_lead_ms: int,
        front_ttl_ms: int,
        clock: Clock = wall_clock_ms,
    ) -> None:
        self._queues = queues
        self._codec = codec
        self._open_lead_ms = open_lead_ms
        self._front_ttl_ms = front_ttl_ms
        self._clock = clock
        self._fronts: dict[int, tuple[int, QueueFront]] = {}  # item -> (read until ms, front)
        self._reading: dict[int, asyncio.Future[QueueFront | None]] = {}

    async def join(self, item_id: int, buyer: str) -> Standing:
        """Put ``buyer`` in the queue, or find them there. ``UnknownItem`` for an item not on
        sale; ``NoWaitingRoom`` for an item without one; ``SaleClosed`` before the queue opens
        or after the sale ended; ``InvalidRequest`` for a malformed buyer id. The queue opens
        ``open_lead_ms`` before the sale, or as long before as the item says."""
        joined = await self._queues.join(item_id, buyer, lead_ms=self._open_lead_ms)
        match joined.outcome:
            case Outcome.UNKNOWN_ITEM:
                raise UnknownItem(f"item {item_id} is not on sale")
            case Outcome.NOT_QUEUED:
                raise NoWaitingRoom(f"item {item_id} has no waiting room: take a ticket")
            case Outcome.NOT_STARTED:
                wait_s = max(1, -(-((joined.opens_at_ms or 0) - self._clock()) // 1000))
                raise SaleClosed(
                    Outcome.NOT_STARTED, f"the queue is not open yet: it opens in {wait_s} s"
                )
            case Outcome.ENDED:
                raise SaleClosed(Outcome.ENDED, "the sale has ended")
        if joined.outcome is Outcome.QUEUED:
            metrics.QUEUE_JOINS.inc()
        front = await self._front(item_id)
        return self._answer(item_id, buyer, joined.position, front)

    async def standing(self, item_id: int, buyer: str, pass_text: str | None) -> Standing:
        """Where the holder of ``pass_text`` stands. ``BadPass`` for a pass that is not this
        buyer's for this item (or expired); ``UnknownItem`` for an item no longer loaded."""
        queue_pass = self._codec.check(
            pass_text, item_id=item_id, buyer=buyer, now_ms=self._clock()
        )
        front = await self._front(item_id)
        position = queue_pass.position
        if position == 0 and front.sealed:  # drawn at the start: learn the place once
            place = await self._queues.place(item_id, buyer)
            position = place.position
        if position == queue_pass.position:
            return Standing(standing(position, front, self._clock()), pass_text or "", queue_pass)
        return self._answer(item_id, buyer, position, front)

    async def admit(self, buyer: str, item_id: int) -> GateDecision:
        """The ticket gate: admitted once the buyer's position is within the frontier."""
        place = await self._queues.place(item_id, buyer)
        if place.outcome is Outcome.UNKNOWN_ITEM:
            raise UnknownItem(f"item {item_id} is not on sale")
        if place.outcome is Outcome.NOT_QUEUED:
            return GateDecision(
                admitted=False,
                retry_after_seconds=1,
                message=f"join the waiting room first: POST /api/v1/items/{item_id}/queue",
            )
        if 0 < place.position <= place.admitted_up_to:
            metrics.QUEUE_WAIT.observe(max(0, self._clock() - place.joined_at_ms) / 1000)
            return ADMITTED
        front = await self._front(item_id)
        seen = standing(place.position, front, self._clock())
        if seen.state is QueueState.SOLD_OUT:
            return GateDecision(admitted=False, retry_after_seconds=60, message="sold out")
        if seen.state is QueueState.ENDED:
            return GateDecision(admitted=False, retry_after_seconds=60, message="the sale ended")
        ahead = "not drawn yet" if seen.ahead is None else f"{seen.ahead} ahead of you"
        return GateDecision(
            admitted=False,
            retry_after_seconds=max(1, seen.estimated_wait_s or 1),
            message=f"not your turn yet: {ahead}",
        )

    def _answer(self, item_id: int, buyer: str, position: int, front: QueueFront) -> Standing:
        queue_pass = QueuePass(
            item_id=item_id,
            buyer=buyer,
            position=position,
            expires_at_ms=front.ends_at_ms + PASS_GRACE_MS,
        )
        seen = standing(position, front, self._clock())
        return Standing(seen, self._codec.mint(queue_pass), queue_pass)

    async def _front(self, item_id: int) -> QueueFront:
        """The item's queue front, read at most once per ``front_ttl_ms`` by this process (one
        read in flight per item: a crowd polling at once waits for the same one)."""
        cached = self._fronts.get(item_id)
        if cached is not None and cached[0] > self._clock():
            return cached[1]
        reading = self._reading.get(item_id)
        if reading is None:
            reading = asyncio.ensure_future(self._queues.front(item_id))
            self._reading[item_id] = reading
            reading.add_done_callback(lambda _: self._reading.pop(item_id, None))
        front = await asyncio.shield(reading)
        if front is None:
            self._fronts.pop(item_id, None)
            raise UnknownItem(f"item {item_id} is not on sale")
        self._fronts[item_id] = (self._clock() + self._front_ttl_ms, front)
        return front
