"""One rehearsed sale: create and warm an item, send the crowd, let it settle, audit it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from seckill.crowd.audit import read_sale_end, verdicts
from seckill.crowd.client import ApiClient, Reply
from seckill.crowd.crowd import Crowd, CrowdLog, StockWatch, watching
from seckill.crowd.plan import CrowdPlan
from seckill.crowd.result import CrowdResult
from seckill.crowd.summary import summarize
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
    log: CrowdLog
    started_at: datetime
    back_on_sale: dict[str, Any] | None = None
    final: dict[str, Any] | None = None
    unsettled: list[Check] = dataclasses.field(default_factory=list)
    watch: StockWatch | None = None  # while the crowd runs: the latest counters seen

    async def audit(self, client: ApiClient, *, database_url: str | None = None) -> list[Check]:
        """The verdicts on the sale as the system keeps it now."""
        counters = await client.counters(self.item_id)
        end = await read_sale_end(
            client,
            self.item_id,
            self.log,
            counters=counters.body if counters.status == 200 else {},
            back_on_sale=self.back_on_sale,
            database_url=database_url,
            concurrency=self.plan.concurrency,
        )
        return self.unsettled + verdicts(self.plan, self.log, end)

    def result(self, target: str, checks: list[Check]) -> CrowdResult:
        return summarize(
            kind=self.kind, target=target, started_at=self.started_at, plan=self.plan,
            item_id=self.item_id, log=self.log, elapsed_s=self.log.now(), checks=checks,
        )  # fmt: skip


async def open_sale(client: ApiClient, plan: CrowdPlan, *, kind: str) -> Sale:
    """Create the item (on sale from a second ago for an hour) and warm it."""
    started_at = datetime.now(UTC)
    created = _expect(
        await client.create_item(
            name=f"{kind} {started_at:%Y-%m-%d %H:%M:%S}",
            total=plan.units,
            per_buyer_limit=plan.per_buyer_limit,
            hold_seconds=plan.hold_seconds,
            starts_at=started_at - timedelta(seconds=1),
            ends_at=started_at + timedelta(hours=1),
        ),
        201,
        "create the item",
    )
    item_id = int(created.body["item_id"])
    _expect(await client.warm(item_id), 200, f"warm item {item_id}")
    return Sale(kind=kind, plan=plan, item_id=item_id, log=CrowdLog(), started_at=started_at)


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
    crowd = Crowd(client, sale.item_id, plan, log)
    watch = StockWatch(client, sale.item_id, log, every_s=LOOK_EVERY_S)
    sale.watch = watch
    patience = plan.hold_seconds + SETTLE_MARGIN_S
    async with watching(watch):
        log.phase = "first crowd"
        await crowd.run_wave(crowd.first_wave(), duration_s=plan.duration_s)
        log.phase = "holds running out"
        sale.back_on_sale = await _wait(
            sale, watch, lambda c: c["redis"]["held"] == 0, patience, "holds ran out"
        )
        if plan.late_crowd:
            log.phase = "late crowd"
            await crowd.run_wave(crowd.late_wave(), duration_s=None)
        log.phase = "landing in SQL"
        sale.final = await _wait(
            sale,
            watch,
            lambda c: c["redis"]["held"] == 0 and c["backlog"] == 0 and c["agree"],
            patience,
            "sale settled",
        )
    log.phase = "audit"


async def _wait(
    sale: Sale, watch: StockWatch, settled: Callable[[dict[str, Any]], bool], patience: float,
    name: str,
) -> dict[str, Any] | None:  # fmt: skip
    try:
        return await watch.until(settled, timeout_s=patience, what=name)
    except TimeoutError as exc:
        sale.unsettled.append(Check(name, False, str(exc)))
        return watch.latest
