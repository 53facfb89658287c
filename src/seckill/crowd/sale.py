"""One rehearsed sale: create and warm an item, send the crowd, let it settle, audit it.

Through a waiting room (a ``QueuePlan``) the sale starts a few seconds after the item is made:
the first crowd joins the queue before the start, the late crowd after it, and every buyer
waits for their turn (``seckill.crowd.waiting``) before buying.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from seckill.crowd.audit import read_book, read_sale_end, verdicts
from seckill.crowd.client import ApiClient, Reply
from seckill.crowd.crowd import Crowd, CrowdLog, StockWatch, watching
from seckill.crowd.deliveries import Feed, delivered
from seckill.crowd.plan import CrowdPlan, QueuePlan
from seckill.crowd.queue_audit import (
    QueueFigures,
    measure_queue,
    queue_out,
    queue_verdicts,
    read_queue_record,
)
from seckill.crowd.result import CrowdResult
from seckill.crowd.summary import summarize
from seckill.crowd.waiting import QueueCrowd
from seckill.domain.money import Money
from seckill.engine.audit import Check

SETTLE_MARGIN_S = 60.0  # beyond the hold time, for the reaper and the persister to catch up
LOOK_EVERY_S = 0.25


class SaleRefused(Exception):
    """The deployment would not set up the sale (bad credentials, an API that is not there)."""


@dataclass(slots=True, kw_only=True)
class Sale:
    """A sale the crowd went through, and what is needed to audit it (again)."""

    kind: str
    plan: CrowdPlan
    item_id: int
    price: Money  # the item's, as its creation answered
    log: CrowdLog
    started_at: datetime
    sale_starts_at: datetime
    queue: QueuePlan | None = None  # None: no waiting room
    back_on_sale: dict[str, Any] | None = None
    final: dict[str, Any] | None = None
    unsettled: list[Check] = dataclasses.field(default_factory=list)
    watch: StockWatch | None = None  # while the crowd runs: the latest counters seen
    queue_figures: QueueFigures | None = None  # measured by the audit

    async def audit(
        self,
        client: ApiClient,
        *,
        database_url: str | None = None,
        database_tls: ssl.SSLContext | None = None,
    ) -> list[Check]:
        """The verdicts on the sale as the system keeps it now."""
        counters = await client.counters(self.item_id)
        end = await read_sale_end(
            client,
            self.item_id,
            self.log,
            counters=counters.body if counters.status == 200 else {},
            back_on_sale=self.back_on_sale,
            database_url=database_url,
            database_tls=database_tls,
            concurrency=self.plan.concurrency,
        )
        checks = self.unsettled + verdicts(self.plan, self.log, end)
        if self.queue is not None:
            record = await read_queue_record(client, self.item_id, self.log)
            self.queue_figures = measure_queue(
                list(self.log.visits.values()), record, queue=self.queue,
                start_s=self.log.since_start(self.sale_starts_at.timestamp()),
            )  # fmt: skip
            checks += queue_verdicts(self.queue_figures)
        return checks

    async def deliveries(
        self,
        feed: Feed,
        *,
        database_url: str | None = None,
        database_tls: ssl.SSLContext | None = None,
        prefix: str,
    ) -> Check:
        """The verdict on what a broker's consumer got of the sale's order events (the bridge's
        work): each order the crowd holds, and with a database every event SQL journaled."""
        book = (
            await read_book(database_url, self.item_id, tls=database_tls) if database_url else None
        )
        return await delivered(
            feed,
            item_id=self.item_id,
            orders={o.order_id: o.status for o in self.log.orders.values()},
            journal=book.journal if book is not None else None,
            prefix=prefix,
        )

    def result(self, target: str, checks: list[Check]) -> CrowdResult:
        figures = self.queue_figures
        return summarize(
            kind=self.kind, target=target, started_at=self.started_at, plan=self.plan,
            item_id=self.item_id, log=self.log, elapsed_s=self.log.now(), checks=checks,
            waiting_room=queue_out(figures) if figures is not None else None,
        )  # fmt: skip


async def open_sale(
    client: ApiClient, plan: CrowdPlan, *, kind: str, queue: QueuePlan | None = None
) -> Sale:
    """Create the item (on sale for an hour: from a second ago, or with a waiting room
    ``queue.lead_s`` from now; without ``queue``, with none whatever the deployment's default)
    and warm it."""
    started_at = datetime.now(UTC)
    starts_at = started_at + (
        timedelta(seconds=queue.lead_s) if queue is not None else timedelta(seconds=-1)
    )
    created = _expect(
        await client.create_item(
            name=f"{kind} {started_at:%Y-%m-%d %H:%M:%S}",
            total=plan.units,
            per_buyer_limit=plan.per_buyer_limit,
            hold_seconds=plan.hold_seconds,
            starts_at=starts_at,
            ends_at=started_at + timedelta(hours=1),
            waiting_room=queue is not None,
            queue_admit_per_second=queue.admit_per_second if queue is not None else None,
        ),
        201,
        "create the item",
    )
    item_id = int(created.body["item_id"])
    price = Money(int(created.body["price_cents"]), str(created.body["currency"]))
    _expect(await client.warm(item_id), 200, f"warm item {item_id}")
    return Sale(
        kind=kind, plan=plan, item_id=item_id, price=price, log=CrowdLog(),
        started_at=started_at, sale_starts_at=starts_at, queue=queue,
    )  # fmt: skip


def _expect(reply: Reply, status: int, what: str) -> Reply:
    if reply.status != status:
        said = reply.body.get("message") or reply.body.get("error") or reply.outcome
        answer = f"HTTP {reply.status}" if reply.status else "no answer"
        raise SaleRefused(f"could not {what}: {answer} ({said})")
    return reply


async def run_sale(client: ApiClient, sale: Sale) -> None:
    """Both crowds, waiting between them for the first crowd's holds to run out, then until
    the sale has settled: no holds left, every event landed in SQL. A wait that times out is
    a failed check, not an exception: the audit still runs."""
    plan, log = sale.plan, sale.log
    crowd = Crowd(client, sale.item_id, plan, log, price=sale.price)
    watch = StockWatch(client, sale.item_id, log, every_s=LOOK_EVERY_S)
    sale.watch = watch
    patience = plan.hold_seconds + SETTLE_MARGIN_S
    async with watching(watch):
        if sale.queue is None:
            await _crowds(crowd, sale, watch, patience)
        else:
            await _crowds_through_the_queue(QueueCrowd(crowd), sale, watch, patience)
        log.phase = "landing in SQL"
        sale.final = await _wait(
            sale,
            watch,
            lambda c: c["redis"]["held"] == 0 and c["backlog"] == 0 and c["agree"],
            patience,
            "sale settled",
        )
    log.phase = "audit"


async def _crowds(crowd: Crowd, sale: Sale, watch: StockWatch, patience: float) -> None:
    """The first crowd, the wait for its holds to run out, then the late crowd."""
    plan, log = sale.plan, sale.log
    log.phase = "first crowd"
    await crowd.run_wave(crowd.first_wave(), duration_s=plan.duration_s)
    await _holds_run_out(sale, watch, patience)
    if plan.late_crowd:
        log.phase = "late crowd"
        await crowd.run_wave(crowd.late_wave(), duration_s=None)


async def _crowds_through_the_queue(
    room: QueueCrowd, sale: Sale, watch: StockWatch, patience: float
) -> None:
    """The first crowd joins before the start, the late crowd after it; everyone waits for
    their turn, or for the truth (sold out); then the holds run out. A buyer still waiting
    when nobody has left the queue for ``patience`` seconds is given up on (a failed check)."""
    plan, log, crowd = sale.plan, sale.log, room.crowd
    started = time.perf_counter()
    log.phase = "first crowd joining"
    first_wave = crowd.first_wave()
    first = await room.join(next(first_wave))
    if first.outcome == "no_waiting_room":
        raise SaleRefused(  # a deployment older than waiting rooms per item
            "the deployment runs no waiting room for the item (404 no_waiting_room): "
            "rehearse without --waiting-room"
        )
    _expect(first, 200, "join the waiting room")
    log.buyers_sent += 1
    await room.enter_all(first_wave, duration_s=plan.duration_s)
    if plan.late_crowd:
        log.phase = "waiting for the start"
        await asyncio.sleep(max(0.0, (sale.sale_starts_at - datetime.now(UTC)).total_seconds()))
        log.phase = "late crowd joining"
        await room.enter_all(crowd.late_wave(), duration_s=None)
    log.phase = "waiting room"
    given_up = await room.drained(patience)
    log.crowd_s += time.perf_counter() - started
    if given_up:
        detail = f"{given_up:,} buyers still waiting after nobody left for {patience:.0f} s"
        sale.unsettled.append(Check("queue moved", False, detail))
    await _holds_run_out(sale, watch, patience)


async def _holds_run_out(sale: Sale, watch: StockWatch, patience: float) -> None:
    sale.log.phase = "holds running out"
    sale.back_on_sale = await _wait(
        sale, watch, lambda c: c["redis"]["held"] == 0, patience, "holds ran out"
    )


async def _wait(
    sale: Sale, watch: StockWatch, settled: Callable[[dict[str, Any]], bool], patience: float,
    name: str,
) -> dict[str, Any] | None:  # fmt: skip
    try:
        return await watch.until(settled, timeout_s=patience, what=name)
    except TimeoutError as exc:
        sale.unsettled.append(Check(name, False, str(exc)))
        return watch.latest
