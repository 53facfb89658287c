"""The crowd through a waiting room: each buyer joins the item's queue, asks where they stand
about once a second, and once let in takes a ticket and buys as every crowd buyer does.

A buyer asks again after its answer's estimated wait, loosely: never sooner than ``POLL_MIN_S``
(an answer may be half a second old anyway) and never later than ``POLL_MAX_S``, so the truth,
sold out, reaches everyone within a bound the audit checks. A little jitter keeps buyers who
joined together from polling together. A refused ticket (429 ``gate_refused``: not their turn
yet) sends the buyer back to polling; sold out or ended sends them home. The replay share joins
a second time once they know their place, which must not change.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from typing import Any

from seckill.crowd.client import Reply
from seckill.crowd.crowd import BuyerSpec, Crowd, QueueVisit
from seckill.domain.queue import QueueState

POLL_MIN_S = 0.5
POLL_MAX_S = 2.0
GATE_REFUSED = "gate_refused"
_JITTER = 0.2  # a poll's pause is stretched or shrunk by up to this share
_OVER = frozenset({QueueState.SOLD_OUT, QueueState.ENDED})
_WATCH_EVERY_S = 1.0


def pause_s(estimated_wait_s: int | None, stretch: float) -> float:
    """How long a waiting buyer lets pass before asking again: the estimated wait (a second
    when unknown) times ``stretch``, kept within ``POLL_MIN_S`` and ``POLL_MAX_S``."""
    wanted = (1.0 if estimated_wait_s is None else float(estimated_wait_s)) * stretch
    return min(POLL_MAX_S, max(POLL_MIN_S, wanted))


class QueueCrowd:
    """The crowd's buyers in the waiting room: joins go through the crowd's lanes; each buyer
    in then waits for their turn in a task of their own, so the lanes move on."""

    def __init__(self, crowd: Crowd) -> None:
        self.crowd = crowd
        self.rng = random.Random(crowd.plan.seed + 1)  # the polls' jitter only
        self.visiting: list[asyncio.Task[None]] = []
        self.last_left = time.perf_counter()  # when a buyer last left: the queue's progress

    async def enter_all(self, buyers: Iterator[BuyerSpec], *, duration_s: float | None) -> None:
        async def enter(spec: BuyerSpec) -> None:
            await self.join(spec)

        await self.crowd.lanes(buyers, enter, duration_s=duration_s)

    async def join(self, spec: BuyerSpec) -> Reply:
        """Join the queue; once in, the buyer waits for their turn in a task of their own."""
        crowd = self.crowd
        answer = await crowd.send("join", lambda: crowd.client.join_queue(crowd.item_id, spec.name))
        if answer.status == 200:
            visit = QueueVisit(
                buyer=spec.name,
                wave=spec.wave,
                joined_at=crowd.log.now(),
                before_start=answer.body["position"] is None,
            )
            crowd.log.visits[spec.name] = visit
            self._learn(visit, answer.body)
            self.visiting.append(asyncio.create_task(self._visit(spec, visit, answer.body)))
        return answer

    async def drained(self, patience_s: float) -> int:
        """Wait until every buyer has left the queue; give up on those still in it once nobody
        left for ``patience_s`` (a queue that stopped moving). Answers how many were given up."""
        pending = [task for task in self.visiting if not task.done()]
        while pending:
            await asyncio.wait(pending, timeout=_WATCH_EVERY_S)
            pending = [task for task in pending if not task.done()]
            if pending and time.perf_counter() - self.last_left > patience_s:
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                return len(pending)
        for task in self.visiting:
            task.result()  # a buyer that failed in the crowd's own code says so here
        return 0

    async def _visit(self, spec: BuyerSpec, visit: QueueVisit, standing: dict[str, Any]) -> None:
        try:
            await self._wait_turn(spec, visit, standing)
        finally:
            self.last_left = time.perf_counter()

    async def _wait_turn(
        self, spec: BuyerSpec, visit: QueueVisit, standing: dict[str, Any]
    ) -> None:
        crowd = self.crowd
        queue_pass = str(standing["pass"])
        while True:
            if spec.replay and visit.joins == 1 and visit.position is not None:
                again = await self._join_again(spec, visit)
                standing = again or standing
            if standing["state"] in _OVER:
                return
            if standing["state"] == QueueState.ADMITTED:
                issued = await crowd.ask_ticket(spec)
                if issued.status == 200:
                    visit.ticket_asked_at = crowd.log.now() - issued.ms / 1000
                    await crowd.purchase(spec, str(issued.body["ticket"]))
                    return
                if issued.outcome != GATE_REFUSED:
                    return  # refused for good, as a buyer without a queue would be
            stretch = self.rng.uniform(1 - _JITTER, 1 + _JITTER)
            await asyncio.sleep(pause_s(standing.get("estimated_wait_s"), stretch))

            async def poll(sent: str = queue_pass) -> Reply:
                return await crowd.client.queue_standing(crowd.item_id, spec.name, queue_pass=sent)

            answer = await crowd.send("poll", poll)
            if answer.status == 200:
                standing, queue_pass = answer.body, str(answer.body["pass"])
                self._learn(visit, standing)
            elif 400 <= answer.status < 500 and answer.status != 429:
                return  # the pass or the buyer was refused: asking again changes nothing

    async def _join_again(self, spec: BuyerSpec, visit: QueueVisit) -> dict[str, Any] | None:
        """A second join, as a buyer who reloads the page does: it must find the same place."""
        crowd = self.crowd
        visit.joins += 1
        answer = await crowd.send(
            "rejoin", lambda: crowd.client.join_queue(crowd.item_id, spec.name)
        )
        if answer.status != 200:
            return None
        self._learn(visit, answer.body)
        return answer.body

    def _learn(self, visit: QueueVisit, standing: dict[str, Any]) -> None:
        log = self.crowd.log
        now = log.now()
        position = standing.get("position")
        if position is not None and position not in visit.positions:
            visit.positions.append(int(position))
        visit.state = state = str(standing["state"])
        if state == QueueState.ADMITTED and visit.seen_admitted_at is None:
            visit.seen_admitted_at = now
        if state == QueueState.SOLD_OUT and visit.seen_sold_out_at is None:
            visit.seen_sold_out_at = now
            if visit.answered_at:
                visit.sold_out_gap_s = now - visit.answered_at
        visit.answered_at = now
        log.admitted_up_to_seen = max(log.admitted_up_to_seen, int(standing["admitted_up_to"]))
