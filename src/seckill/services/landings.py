"""Waiting for SQL to hold what payment notices did, before the provider is answered.

The provider acts on a notice's answer and never sends it again, so the answer waits for the
record (SQL): the persister lands the notice's event within tens of milliseconds, later through
a backlog. Every notice of the process waits on one watch, which asks SQL for all of them at
once every ``every_s`` (two statements a look however many wait), so a burst of notices costs
SQL a few looks, not a few statements each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from seckill.domain.holds import PaymentSettlement
from seckill.domain.orders import RELEASED_STATUSES, OrderStatus
from seckill.domain.outcomes import Outcome
from seckill.store.payments import Payments, Settled

log = logging.getLogger(__name__)

# A look every 10 ms while a notice waits: about the persister's own pace (it lingers 20 ms
# after a part-full batch).
LOOK_EVERY_S = 0.01
FAILED_PAUSE_S = 0.5  # after a look SQL failed: not a statement every 10 ms at a database down


@dataclass(frozen=True, slots=True)
class Answered:
    """What a notice is about to tell the provider: its order, payment and outcome."""

    item_id: int
    order_id: int
    payment_id: str
    outcome: Outcome

    @classmethod
    def of(
        cls, item_id: int, order_id: int, payment_id: str, settlement: PaymentSettlement
    ) -> Answered:
        return cls(item_id, order_id, payment_id, settlement.outcome)

    def held_by(self, sql: Settled) -> bool:
        """Whether SQL holds the state this answer tells: its refund owed, or the order paid
        (by this payment, when it paid it) or released."""
        if self.outcome is Outcome.REFUND_REQUIRED:
            return (self.item_id, self.payment_id) in sql.refunds
        item_id, status, payment_id = sql.orders.get(self.order_id, (None, None, None))
        if item_id != self.item_id:
            return False
        match self.outcome:
            case Outcome.PAID:
                return status is OrderStatus.PAID and payment_id == self.payment_id
            case Outcome.ALREADY_PAID:
                return status is OrderStatus.PAID
            case Outcome.RELEASED | Outcome.ALREADY_RELEASED:
                return status in RELEASED_STATUSES
        raise ValueError(f"a payment notice does not answer {self.outcome}")


class Landings:
    """One watch over SQL for every notice of the process that waits for it."""

    def __init__(self, payments: Payments, *, every_s: float = LOOK_EVERY_S) -> None:
        self._payments = payments
        self._every_s = every_s
        self._waiting: dict[Answered, list[asyncio.Future[None]]] = {}
        self._watch: asyncio.Task[None] | None = None

    async def held(self, answered: Answered, *, timeout_s: float) -> bool:
        """Whether SQL holds ``answered`` within ``timeout_s``."""
        future = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(answered, []).append(future)
        if self._watch is None or self._watch.done():
            self._watch = asyncio.create_task(self._look())
        try:
            async with asyncio.timeout(timeout_s):
                await future
            return True
        except TimeoutError:
            return False
        finally:
            waiters = self._waiting.get(answered, [])
            with contextlib.suppress(ValueError):
                waiters.remove(future)
            if not waiters:
                self._waiting.pop(answered, None)

    async def _look(self) -> None:
        """Ask SQL for every waiting answer, each ``every_s``, until none waits."""
        while self._waiting:
            await asyncio.sleep(self._every_s)
            waiting = list(self._waiting)
            try:
                sql = await self._payments.settled(
                    {a.order_id for a in waiting if a.outcome is not Outcome.REFUND_REQUIRED},
                    {(a.item_id, a.payment_id) for a in waiting
                     if a.outcome is Outcome.REFUND_REQUIRED},
                )  # fmt: skip
            except Exception as exc:  # SQL away: the notices wait on, then are answered 503
                log.warning("%d payment notices wait for SQL, which failed: %s", len(waiting), exc)
                await asyncio.sleep(FAILED_PAUSE_S)
                continue
            for answered in waiting:
                if answered.held_by(sql):
                    for future in self._waiting.pop(answered, []):
                        if not future.done():
                            future.set_result(None)
