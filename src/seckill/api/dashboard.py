"""The operators' dashboard: a page (``/dashboard``) and the snapshot it polls every second.

The page holds no data, so anyone may load it; it asks for an admin token and sends it with
each poll of ``GET /api/v1/admin/dashboard``. It is one file that needs no network: uPlot is
inlined from ``seckill/static/vendor``, as in the crowd's reports.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from functools import cache
from socket import gethostname
from string import Template
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, Field

from seckill import __version__
from seckill.api.auth import AdminIdentity
from seckill.api.context import context
from seckill.api.errors import documented
from seckill.api.schemas import Counters
from seckill.bootstrap.services import Context
from seckill.domain.rules import MAX_ID
from seckill.pages import PAGE_HEADERS, inline, page_fields, static_text, uplot_fields
from seckill.services.dashboard import MAX_ITEMS, DashboardSnapshot, take_snapshot

router = APIRouter()
Ctx = Annotated[Context, Depends(context)]


class DashboardItem(BaseModel):
    item_id: int
    redis: Counters | None = Field(description="The counters in Redis; null if not loaded.")
    backlog: int = Field(description="Stream entries not yet landed in SQL (pending + lag).")
    pending: int = Field(description="Delivered to the persister, not yet acknowledged.")
    lag: int = Field(description="Not yet delivered to the persister.")
    dead_letters: int | None = Field(
        description="Entries the persister gave up on, not replayed; null if SQL did not answer."
    )
    queue: QueueOut | None = Field(description="Its waiting room; null if nobody joined.")
    refunds_owed: RefundsOwedOut | None = Field(
        description="Charges that paid nothing, not yet given back; null if SQL did not answer."
    )
    sinks: dict[str, int] = Field(
        description="Backlog of every other consumer group of its streams (a bridge to a "
        "broker, e.g. bridge-nats): entries its sink does not have yet."
    )


class RefundsOwedOut(BaseModel):
    count: int
    amounts: dict[str, int] = Field(
        description="Sums owed back by currency (ISO 4217 code -> minor units)."
    )


class QueueOut(BaseModel):
    joined: int = Field(description="Buyers in the waiting room.")
    admitted_up_to: int = Field(description="Every position up to this one was let in.")
    waiting: int = Field(description="Buyers not let in yet.")


class RequestCount(BaseModel):
    route: str
    outcome: str
    count: int


class ReaperStatus(BaseModel):
    last_pass_at: datetime | None
    releases: int | None = Field(description="Holds released since this process started.")


class ReconcilerStatus(BaseModel):
    last_pass_at: datetime | None
    drift: dict[str, int] = Field(description="Drift found at the last pass, by kind.")


class DashboardOut(BaseModel):
    server: str = Field(description="The process that answered: version, host and pid.")
    metrics_source: str = Field(
        description="Whose counters these are: this process's, or every process's on its host "
        "(with a shared metrics directory). Rates are only meaningful between two snapshots "
        "from the same source."
    )
    server_time: datetime = Field(description="Redis's clock, which every process shares.")
    items: list[DashboardItem]
    items_in_registry: int = Field(
        description=f"Items ever loaded; without `item`, the newest {MAX_ITEMS} are shown."
    )
    database_available: bool
    requests: list[RequestCount] = Field(
        description="Requests this process answered, by route and outcome, since it started."
    )
    dead_letters_recorded: int | None = Field(
        description="Entries this process dead-lettered since it started."
    )
    reaper: ReaperStatus
    reconciler: ReconcilerStatus


ItemQuery = Annotated[
    list[Annotated[int, Field(ge=1, le=MAX_ID)]] | None,
    Query(max_length=MAX_ITEMS, description="Items to show (repeatable); default: the newest."),
]


@router.get(
    "/api/v1/admin/dashboard",
    tags=["admin"],
    response_model=DashboardOut,
    responses=documented(401, 403, 422, 503),
)
async def dashboard_data(_: AdminIdentity, ctx: Ctx, item: ItemQuery = None) -> DashboardOut:
    """One snapshot for the dashboard: per item the counters in Redis, the stream backlog, the
    dead letters and the refunds owed; this process's request counters and the reaper's and
    reconciler's last pass."""
    runtime = ctx.runtime
    return _out(await take_snapshot(runtime.engine, ctx.ledger, item))


@router.get("/dashboard", include_in_schema=False, response_class=HTMLResponse)
async def dashboard_page() -> HTMLResponse:
    return HTMLResponse(render_page(), headers=PAGE_HEADERS)


@cache
def render_page() -> str:
    """The page, with its script and uPlot inlined."""
    return Template(static_text("dashboard.html")).substitute(
        **page_fields(), **uplot_fields(),
        dashboard_js=inline(static_text("dashboard.js"), "script"),
    )  # fmt: skip


def _out(snapshot: DashboardSnapshot) -> DashboardOut:
    metrics = snapshot.metrics
    requests = metrics.by("seckill_http_requests_total", "route", "outcome")
    recorded = metrics.total("seckill_dead_letters_total")
    releases = metrics.total("seckill_reaper_releases_total")
    host, pid = gethostname(), os.getpid()
    return DashboardOut(
        server=f"seckill {__version__} on {host}, pid {pid}",
        metrics_source=host if metrics.shared else f"{host}, pid {pid}",
        server_time=datetime.fromtimestamp(snapshot.server_time_ms / 1000, UTC),
        items=[
            DashboardItem(
                item_id=view.item_id,
                redis=None
                if view.stock is None
                else Counters(
                    total=view.stock.total,
                    available=view.stock.available,
                    held=view.stock.held,
                    sold=view.stock.sold,
                ),
                backlog=view.persister.backlog,
                pending=view.persister.pending,
                lag=view.persister.lag,
                dead_letters=view.dead_letters,
                refunds_owed=None
                if view.refunds_owed is None
                else RefundsOwedOut(
                    count=view.refunds_owed.count, amounts=view.refunds_owed.amounts
                ),
                sinks=view.sinks,
                queue=None
                if view.queue is None
                else QueueOut(
                    joined=view.queue.joined,
                    admitted_up_to=view.queue.admitted_up_to,
                    waiting=max(0, view.queue.joined - view.queue.admitted_up_to),
                ),
            )
            for view in snapshot.items
        ],
        items_in_registry=snapshot.items_in_registry,
        database_available=snapshot.database_available,
        requests=[
            RequestCount(route=route, outcome=outcome, count=round(count))
            for (route, outcome), count in sorted(requests.items())
        ],
        dead_letters_recorded=None if recorded is None else round(recorded),
        reaper=ReaperStatus(
            last_pass_at=_at(metrics.latest("seckill_reaper_last_pass_timestamp_seconds")),
            releases=None if releases is None else round(releases),
        ),
        reconciler=ReconcilerStatus(
            last_pass_at=_at(metrics.latest("seckill_reconciler_last_pass_timestamp_seconds")),
            drift={
                kind: round(count)
                for (kind,), count in sorted(metrics.by("seckill_reconciler_drift", "kind").items())
            },
        ),
    )


def _at(seconds: float | None) -> datetime | None:
    # A gauge not set yet reads 0: no pass so far.
    return None if not seconds else datetime.fromtimestamp(seconds, UTC)
