"""A whole rehearsal against one API: the sale, the live view, the audit, the reports."""

from __future__ import annotations

import contextlib
import ssl
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from rich.console import Console
from rich.live import Live

from seckill.crowd.client import ApiClient, Credentials
from seckill.crowd.deliveries import following
from seckill.crowd.live import LiveView, print_result
from seckill.crowd.plan import CrowdPlan, QueuePlan
from seckill.crowd.result import CrowdResult
from seckill.crowd.sale import Sale, open_sale, run_sale

REQUEST_TIMEOUT_S = 30


@dataclass(frozen=True, slots=True)
class Rehearsal:
    sale: Sale
    result: CrowdResult
    json_path: Path | None
    html_path: Path | None


def session(concurrency: int) -> aiohttp.ClientSession:
    """One connection per lane, plus a few for the stock watch and the audit."""
    connector = aiohttp.TCPConnector(limit=concurrency + 4, keepalive_timeout=2)
    return aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    )


async def rehearse(
    url: str,
    plan: CrowdPlan,
    credentials: Credentials,
    *,
    kind: str,
    console: Console,
    database_url: str | None = None,
    database_tls: ssl.SSLContext | None = None,
    report_dir: Path | None = None,
    queue: QueuePlan | None = None,
    bridge_url: str | None = None,
    since_ms: int = 0,
    prefix: str,
) -> Rehearsal:
    """Run the sale against ``url``, showing it live, then audit it and write the reports
    (``<report_dir>/<kind>-<time>.json`` and ``.html``) unless ``report_dir`` is None.
    ``queue``: the crowd goes through the deployment's waiting room. ``bridge_url``: the broker
    the deployment's bridge forwards to; a consumer follows it from before the item is made
    (skipping messages older than ``since_ms`` or of other key prefixes than the deployment's
    ``prefix``), and one more verdict judges what it got. ``database_url``: the deployment's
    database, whose rows are audited too (over TLS with ``database_tls``)."""
    from seckill.crowd.report import write_reports

    async with contextlib.AsyncExitStack() as stack:
        feed = None
        if bridge_url:
            feed = await stack.enter_async_context(following(bridge_url, since_ms=since_ms))
        http = await stack.enter_async_context(session(plan.concurrency))
        client = ApiClient(http, url, credentials)
        sale = await open_sale(client, plan, kind=kind, queue=queue)
        with Live(LiveView(sale), console=console, refresh_per_second=4):
            await run_sale(client, sale)
        checks = await sale.audit(client, database_url=database_url, database_tls=database_tls)
        if feed is not None:
            sale.log.phase = "order events"
            delivered = await sale.deliveries(
                feed, database_url=database_url, database_tls=database_tls, prefix=prefix
            )
            checks.append(delivered)
    result = sale.result(url, checks)
    print_result(console, result)
    json_path = html_path = None
    if report_dir is not None:
        name = f"{kind}-{sale.started_at:%Y%m%d-%H%M%S}-item{sale.item_id}"
        json_path, html_path = write_reports(result, report_dir, name)
        console.print(f"Reports: {json_path} and {html_path}")
    return Rehearsal(sale, result, json_path, html_path)
