"""The ``seckill`` command."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import shutil
import tempfile
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from seckill import __version__

if TYPE_CHECKING:
    from seckill.bootstrap import Runtime
    from seckill.crowd.client import Credentials
    from seckill.crowd.plan import CrowdPlan
    from seckill.domain.items import Stock
    from seckill.reconcile.reconciler import ItemReport
    from seckill.services.item_cache import ItemCache

app = typer.Typer(help="seckill: a flash-sale backend.", no_args_is_help=True, add_completion=False)
db_app = typer.Typer(help="The SQL database.", no_args_is_help=True)
item_app = typer.Typer(help="Items: created in SQL, warmed into Redis.", no_args_is_help=True)
worker_app = typer.Typer(help="Background workers.", no_args_is_help=True)
dead_app = typer.Typer(help="Stream entries the persister gave up on.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(item_app, name="item")
app.add_typer(worker_app, name="worker")
app.add_typer(dead_app, name="dead-letters")
console = Console()
T = TypeVar("T")


def _with_runtime(work: Callable[[Runtime], Awaitable[T]]) -> T:
    """Run ``work`` with everything wired from the environment's settings; clear errors out."""
    from seckill.bootstrap import open_runtime
    from seckill.config import Settings
    from seckill.domain.outcomes import InvalidRequest
    from seckill.services.items import UnknownItem

    async def main() -> T:
        async with open_runtime(Settings()) as runtime:
            return await work(runtime)

    try:
        return asyncio.run(main())
    except (InvalidRequest, UnknownItem) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None


@app.callback()
def main() -> None:
    """Flash sales decided in Redis, one atomic script per purchase."""


@app.command()
def version() -> None:
    """Print the version."""
    console.print(f"seckill {__version__}")


def _logging() -> None:
    from seckill.config import Settings
    from seckill.observability.logs import configure_logging

    settings = Settings()
    configure_logging(settings.log_format, settings.log_level)


def _metrics_dir(*, processes: int = 1) -> None:
    """With SECKILL_METRICS_DIR, this process writes its metrics into files there, which every
    process of the deployment shares. prometheus_client picks its mode when first imported, so
    this runs before anything imports it (seckill.serve and the workers do)."""
    import os
    import sys

    from seckill.config import Settings

    settings = Settings()
    path = settings.metrics_dir
    if path is None and processes > 1:
        # The API's own processes still add up: a directory of its own, emptied at start.
        path = settings.data_dir / "metrics"
        shutil.rmtree(path, ignore_errors=True)
    if path is None:
        return
    if "prometheus_client" in sys.modules:
        raise RuntimeError("prometheus_client was imported before PROMETHEUS_MULTIPROC_DIR was set")
    path.mkdir(parents=True, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path.resolve())


def _run(*, api: bool, workers: list[str], host: str | None, port: int | None) -> None:
    _metrics_dir()  # before the imports below
    from seckill.config import Settings
    from seckill.serve import WorkerKind, run_blocking

    _logging()
    settings = Settings()
    updates = {k: v for k, v in (("api_host", host), ("api_port", port)) if v is not None}
    settings = settings.model_copy(update=updates)
    try:
        run_blocking(settings, api=api, workers=[WorkerKind(w) for w in workers])
    except OSError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None


_HOST = typer.Option(None, help="Listen address (default SECKILL_API_HOST, 127.0.0.1).")
_PORT = typer.Option(None, min=0, max=65535, help="Port (default SECKILL_API_PORT, 8000).")


@app.command()
def serve(host: str | None = _HOST, port: int | None = _PORT) -> None:
    """Run the API and every worker (persister, reaper, reconciler) in one process until
    SIGTERM."""
    _run(api=True, workers=["persister", "reaper", "reconciler"], host=host, port=port)


class ApiServer(StrEnum):
    GRANIAN = "granian"
    UVICORN = "uvicorn"


_SERVER = typer.Option(
    None,
    "--server",
    help="What serves the API (default SECKILL_API_SERVER, granian: the faster floor in "
    "benchmarks/http.py; figures in the README's Benchmarks).",
)


@app.command()
def api(
    host: str | None = _HOST,
    port: int | None = _PORT,
    processes: int = typer.Option(
        1, "--workers", min=1, help="API processes sharing the port (more than 1: a shared Redis)."
    ),
    server: ApiServer | None = _SERVER,
) -> None:
    """Run the API alone (workers run apart: `seckill worker ...`) until SIGTERM."""
    from seckill.config import Settings

    chosen = ApiServer(server or Settings().api_server)
    if chosen is ApiServer.UVICORN and processes == 1:
        _run(api=True, workers=[], host=host, port=port)
        return
    _metrics_dir(processes=processes)  # before the imports below
    from seckill.serve import run_api_granian, run_api_processes

    _logging()
    updates = {k: v for k, v in (("api_host", host), ("api_port", port)) if v is not None}
    run = run_api_granian if chosen is ApiServer.GRANIAN else run_api_processes
    try:
        run(Settings().model_copy(update=updates), processes)
    except (OSError, ValueError) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None


@app.command()
def token(
    buyer: str | None = typer.Option(None, help="Mint a buyer token for this buyer id."),
    admin: bool = typer.Option(False, "--admin", help="Mint an admin token."),
    ttl: int | None = typer.Option(
        None, min=1, help="Seconds (default SECKILL_TOKEN_TTL_SECONDS)."
    ),
) -> None:
    """Print a bearer token (for tests and demos; production tokens come from your identity
    provider, signed with the same key)."""
    from seckill.config import Settings
    from seckill.domain.outcomes import InvalidRequest
    from seckill.security.tokens import Role, token_codec

    if (buyer is None) == (not admin):
        console.print("[red]error:[/] give exactly one of --buyer ID or --admin")
        raise typer.Exit(2)
    settings = Settings()
    subject, role = (buyer, Role.BUYER) if buyer is not None else ("admin", Role.ADMIN)
    try:
        minted = token_codec(settings).mint(
            subject, role, ttl_seconds=ttl or settings.token_ttl_seconds
        )
    except (ValueError, InvalidRequest) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    print(minted)


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Create or migrate the schema to the newest revision."""
    from seckill.config import Settings
    from seckill.store.database import open_database
    from seckill.store.migrate import upgrade

    async def main() -> None:
        database = open_database(Settings().effective_database_url)
        try:
            await upgrade(database)
        finally:
            await database.dispose()

    asyncio.run(main())
    console.print("schema is current")


def _when(text: str, option: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not an ISO 8601 time", param_hint=option) from None
    if moment.tzinfo is None:
        raise typer.BadParameter(
            "give a time zone, e.g. 2026-11-21T20:00:00+00:00", param_hint=option
        )
    return moment


@item_app.command("create")
def item_create(
    name: str = typer.Option(..., help="What buyers see."),
    price_cents: int = typer.Option(..., min=0, help="Price of one unit, in cents."),
    total: int = typer.Option(..., min=0, help="Units on sale."),
    starts_at: str = typer.Option("", help="Sale start, ISO 8601 with zone (default: now)."),
    ends_at: str = typer.Option("", help="Sale end, ISO 8601 with zone (default: start + 1 h)."),
    limit: int = typer.Option(1, min=1, help="Units one buyer may hold or buy."),
    hold_seconds: int = typer.Option(300, min=1, help="Time a buyer has to pay."),
) -> None:
    """Create an item in the database (warm it to put it on sale)."""
    from seckill.domain.items import NewItem

    start = _when(starts_at, "--starts-at") if starts_at else datetime.now(UTC)
    end = _when(ends_at, "--ends-at") if ends_at else start + timedelta(hours=1)

    async def work(runtime: Runtime) -> int:
        new = NewItem(
            name=name, price_cents=price_cents, total=total, starts_at=start, ends_at=end,
            per_buyer_limit=limit, hold_seconds=hold_seconds,
        )  # fmt: skip
        return await runtime.ledger.create_item(new)

    console.print(f"created item {_with_runtime(work)}")


@item_app.command("warm")
def item_warm(
    item_id: int = typer.Argument(..., min=1),
    force: bool = typer.Option(False, help="Replace the settings of an item with holds or sales."),
) -> None:
    """Load an item from the database into Redis, putting it on sale (and its cached card)."""
    from seckill.services.items import warm_item

    async def work(runtime: Runtime) -> str:
        return await warm_item(
            runtime.engine, runtime.ledger, item_id, force=force, cache=_item_cache(runtime)
        )

    console.print(f"item {item_id}: {_with_runtime(work)}")


def _item_cache(runtime: Runtime) -> ItemCache:
    from seckill.services.item_cache import ItemCache

    return ItemCache.from_settings(runtime.settings, engine=runtime.engine, source=runtime.ledger)


@app.command()
def warm(
    force: bool = typer.Option(
        False, help="Reload items with holds or sales too (they keep them)."
    ),
) -> None:
    """Warm every item whose sale has not ended: into Redis, where it is sold, and its cached
    card, what buyers read. Items already selling are kept as they are unless --force."""
    from seckill.domain.outcomes import ErrorCode
    from seckill.services.items import WarmedItem, warm_items

    async def work(runtime: Runtime) -> list[WarmedItem]:
        return await warm_items(
            runtime.engine, runtime.ledger, _item_cache(runtime), now=datetime.now(UTC), force=force
        )

    warmed = _with_runtime(work)
    table = Table(title=f"Warmed {len(warmed)} item(s) whose sale has not ended")
    for column in ("item", "name", "starts at", "ends at", "redis", "card expires in"):
        table.add_column(column)
    refused = False
    for w in warmed:
        r = w.record
        redis = w.outcome.value
        if w.outcome is ErrorCode.ITEM_ACTIVE:
            redis = "kept (item_active: holds or sales)"
        elif isinstance(w.outcome, ErrorCode):
            redis, refused = f"[red]{w.outcome.value}[/]", True
        table.add_row(
            str(r.item_id), r.name, r.starts_at.isoformat(timespec="seconds"),
            r.ends_at.isoformat(timespec="seconds"), redis, _ttl(w.card_ttl_ms),
        )  # fmt: skip
    console.print(table)
    if refused:
        raise typer.Exit(1)


def _ttl(ms: int | None) -> str:
    if ms is None:
        return "[red]no card[/]"
    return "never" if ms < 0 else str(timedelta(seconds=ms // 1000))


@worker_app.command("persister")
def worker_persister(
    batch_size: int = typer.Option(500, min=1, max=10_000),
    claim_idle_ms: int = typer.Option(30_000, min=10, help="Take over entries idle this long."),
    max_deliveries: int = typer.Option(5, min=1, help="Deliveries before a dead letter."),
) -> None:
    """Land every item stream's events in the database until SIGTERM."""
    _metrics_dir()  # before the imports below
    from seckill.config import Settings
    from seckill.serve import WorkerKind, run_blocking
    from seckill.workers.persister import PersisterConfig

    _logging()
    config = PersisterConfig(
        batch_size=batch_size, claim_idle_ms=claim_idle_ms, max_deliveries=max_deliveries
    )
    run_blocking(Settings(), api=False, workers=[WorkerKind.PERSISTER], persister=config)


@worker_app.command("reaper")
def worker_reaper(
    interval: float | None = typer.Option(
        None, min=0.01, help="Seconds between passes (default SECKILL_REAPER_INTERVAL_SECONDS)."
    ),
) -> None:
    """Release holds past their deadline, every interval, until SIGTERM. Replicas are safe."""
    _metrics_dir()  # before the imports below
    from seckill.config import Settings
    from seckill.serve import WorkerKind, run_blocking

    _logging()
    settings = Settings()
    if interval is not None:
        settings = settings.model_copy(update={"reaper_interval_seconds": interval})
    run_blocking(settings, api=False, workers=[WorkerKind.REAPER])


@worker_app.command("reconciler")
def worker_reconciler(
    interval: float | None = typer.Option(
        None, min=0.01, help="Seconds between passes (default SECKILL_RECONCILE_INTERVAL_SECONDS)."
    ),
    repair: bool | None = typer.Option(
        None,
        "--repair/--report-only",
        help="Repair what is found (default SECKILL_RECONCILE_REPAIR).",
    ),
) -> None:
    """Compare every item's Redis and SQL records each interval, until SIGTERM; log drift and,
    with --repair, repair it. Replicas are safe: one holds the upkeep lock and works."""
    _metrics_dir()  # before the imports below
    from seckill.config import Settings
    from seckill.serve import WorkerKind, run_blocking

    _logging()
    settings = Settings()
    updates = {
        k: v
        for k, v in (("reconcile_interval_seconds", interval), ("reconcile_repair", repair))
        if v is not None
    }
    run_blocking(settings.model_copy(update=updates), api=False, workers=[WorkerKind.RECONCILER])


@app.command()
def reconcile(
    items: list[int] = typer.Argument(None, help="Item ids (default: every item on sale)."),
    repair: bool = typer.Option(False, "--repair", help="Repair the drift found (journaled)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Prove Redis and SQL agree, item by item, while the sale runs. Exit code 1 if drift is
    found (with --repair: if any is left after repairing), 0 otherwise."""
    from seckill.reconcile.reconciler import Reconciler

    async def work(runtime: Runtime) -> list[ItemReport]:
        grace_ms = int(runtime.settings.reconcile_grace_seconds * 1000)
        reconciler = Reconciler(runtime.engine, runtime.ledger, grace_ms=grace_ms)
        chosen = items or await reconciler.item_ids()
        return [await reconciler.reconcile(item_id, repair=repair) for item_id in chosen]

    reports = _with_runtime(work)
    if as_json:
        print(json.dumps([_report_json(r) for r in reports], indent=2))
    else:
        for report in reports:
            _print_report(report)
    if any(report.left for report in reports):
        raise typer.Exit(1)


def _report_json(report: ItemReport) -> dict[str, object]:
    def stock(s: Stock | None) -> dict[str, int] | None:
        return None if s is None else dataclasses.asdict(s)

    return {
        "item_id": report.item_id,
        "position": report.position,
        "redis": stock(report.redis_stock),
        "sql": stock(report.sql_stock),
        "drift": bool(report.left),
        "found": [dataclasses.asdict(f) for f in report.found],
        "repairs": [dataclasses.asdict(r) for r in report.repairs],
        "left": [dataclasses.asdict(f) for f in report.left],
    }


def _print_report(report: ItemReport) -> None:
    def stock(s: Stock | None) -> str:
        return "-" if s is None else f"{s.available} / {s.held} / {s.sold} of {s.total}"

    verdict = "[red]drift[/]" if report.left else "[green]agree[/]"
    console.print(
        f"item {report.item_id}: {verdict} as of stream position {report.position}; "
        f"available / held / sold: Redis {stock(report.redis_stock)}, SQL {stock(report.sql_stock)}"
    )
    if report.found:
        table = Table(title=f"item {report.item_id}: found")
        for column in ("kind", "subject", "Redis", "SQL", "detail"):
            table.add_column(column)
        for f in report.found:
            table.add_row(f.kind, f.subject, f.redis, f.sql, f.detail)
        console.print(table)
    if report.repairs:
        table = Table(title=f"item {report.item_id}: repaired (journaled)")
        for column in ("kind", "subject", "action", "detail"):
            table.add_column(column)
        for r in report.repairs:
            table.add_row(r.kind, r.subject, r.action, r.detail)
        console.print(table)


@app.command()
def recover(item_id: int = typer.Argument(..., help="The item to rebuild in Redis.")) -> None:
    """Rebuild an item's Redis state from SQL after Redis lost it (restarted empty, an older
    AOF, a failover): counters, live holds with their deadlines, buyers' units. What Redis still
    has beyond SQL is kept; the sale goes on with no unit sold twice."""
    from seckill.reconcile.recovery import recover_item

    async def work(runtime: Runtime) -> None:
        done = await recover_item(runtime.engine, runtime.ledger, item_id)
        s = done.stock
        console.print(
            f"item {item_id} recovered: {done.restored} holds restored from SQL, "
            f"{done.advanced} moved forward, {done.conflicts} conflicts (SQL kept); "
            f"available {s.available}, held {s.held}, sold {s.sold} of {s.total}"
        )

    _with_runtime(work)


@dead_app.command("list")
def dead_letters_list(
    everything: bool = typer.Option(False, "--all", help="Include replayed ones."),
) -> None:
    """Show dead letters with their errors."""

    async def work(runtime: Runtime) -> None:
        table = Table(title="Dead letters")
        for column in ("id", "stream", "entry", "deliveries", "error", "replayed"):
            table.add_column(column)
        for d in await runtime.ledger.dead_letters(include_replayed=everything):
            replayed = d.replayed_at.isoformat(timespec="seconds") if d.replayed_at else ""
            table.add_row(str(d.id), d.stream, d.entry_id, str(d.deliveries), d.error, replayed)
        console.print(table)

    _with_runtime(work)


@dead_app.command("replay")
def dead_letters_replay(
    ids: list[int] = typer.Argument(None, help="Dead letter ids (default: every pending one)."),
) -> None:
    """Land dead letters again (after fixing what made them fail); each lands once at most."""
    from seckill.domain.events import BadEvent, decode_event

    async def work(runtime: Runtime) -> bool:
        letters = await runtime.ledger.dead_letters()
        chosen = [d for d in letters if not ids or d.id in ids]
        missing = set(ids or ()) - {d.id for d in letters}
        for dead_id in sorted(missing):
            console.print(f"[red]{dead_id}[/]: no pending dead letter with this id")
        ok = not missing
        for letter in chosen:
            try:
                event = decode_event(letter.entry_id, letter.payload)
                await runtime.ledger.apply([event])
            except BadEvent as exc:
                console.print(f"[red]{letter.id}[/]: still cannot land: {exc}")
                ok = False
                continue
            await runtime.ledger.mark_replayed(letter.id)
            console.print(f"[green]{letter.id}[/]: landed")
        return ok

    if not _with_runtime(work):
        raise typer.Exit(1)


_REPORT_DIR = typer.Option(
    Path("seckill-reports"), help="Where the JSON result and the HTML report are written."
)
_CONCURRENCY = typer.Option(64, min=1, help="Buyers in flight at once.")
_LIMIT = typer.Option(2, min=1, help="Units one buyer may hold or buy.")
_HOLD = typer.Option(2, min=1, help="Seconds a buyer has to pay.")


@app.command()
def demo(
    buyers: int = typer.Option(10_000, min=1, help="Buyers in the first crowd."),
    units: int = typer.Option(100, min=1, help="Units on sale."),
    limit: int = _LIMIT,
    hold_seconds: int = _HOLD,
    concurrency: int = _CONCURRENCY,
    report_dir: Path = _REPORT_DIR,
) -> None:
    """A live flash sale: start the API and workers on embedded defaults, rush them with a
    crowd over HTTP, and print the verdict (exit 1 if any check fails)."""
    from seckill.crowd.client import Credentials
    from seckill.demo import ServerFailed, demo_settings, serving

    plan = _plan(
        buyers=buyers, units=units, per_buyer_limit=limit, hold_seconds=hold_seconds,
        concurrency=concurrency,
    )  # fmt: skip
    console.print(
        f"[bold]Flash sale[/]: {plan.buyers:,} buyers (then {plan.late_crowd:,} late ones) for "
        f"{plan.units:,} units, limit {plan.per_buyer_limit} each, holds of {plan.hold_seconds} s,"
        f" {plan.concurrency} in flight"
    )
    # The demo's data directory is throwaway: it never touches the real one.
    with (
        tempfile.TemporaryDirectory(prefix="seckill-demo-") as scratch,
        contextlib.ExitStack() as stack,
    ):
        settings = demo_settings(Path(scratch))
        try:
            with console.status("starting seckill serve: API, persister, reaper, reconciler"):
                url = stack.enter_context(serving(settings.data_dir))
        except ServerFailed as exc:
            console.print(f"[red]error:[/] {exc}")
            raise typer.Exit(2) from None
        console.print(f"seckill serve is up on {url}; the crowd rushes in")
        passed = _rehearse(
            "demo", url, plan, Credentials.from_settings(settings),
            database_url=settings.effective_database_url, report_dir=report_dir,
        )  # fmt: skip
    raise typer.Exit(0 if passed else 1)


@app.command()
def bench(
    url: str = typer.Option(..., help="The deployment's base URL, e.g. http://127.0.0.1:8000."),
    admin_token: str | None = typer.Option(
        None, envvar="SECKILL_ADMIN_TOKEN", help="An admin token (default: minted from the keys)."
    ),
    database_url: str | None = typer.Option(
        None, help="The deployment's SQL database, to audit its order rows too."
    ),
    buyers: int = typer.Option(
        10_000, min=1, help="Buyers in the first crowd (a cap with --duration)."
    ),
    late_buyers: int | None = typer.Option(
        None, min=0, help="Buyers for the units that come back (default: a quarter of --buyers)."
    ),
    duration: float | None = typer.Option(
        None, min=0.1, help="Seconds the first crowd keeps arriving (default: until --buyers)."
    ),
    units: int = typer.Option(100, min=1, help="Units of the item the bench puts on sale."),
    limit: int = _LIMIT,
    hold_seconds: int = _HOLD,
    concurrency: int = _CONCURRENCY,
    pay: float = typer.Option(0.5, min=0, max=1, help="Share of holds paid."),
    fail: float = typer.Option(0.05, min=0, max=1, help="Share of holds whose payment fails."),
    cancel: float = typer.Option(0.2, min=0, max=1, help="Share of holds cancelled."),
    replay: float = typer.Option(0.1, min=0, max=1, help="Share of buyers who click twice."),
    seed: int = typer.Option(7, help="The crowd's random seed."),
    report_dir: Path = _REPORT_DIR,
) -> None:
    """Rehearse a sale against a running deployment: a new item, the crowd over HTTP, per
    outcome req/s and latency, then the verdict (exit 1 if any check fails, 2 if the sale
    could not be set up). Buyer tokens and payment notices are signed with the deployment's
    keys, read from the same SECKILL_* settings it runs with."""
    from seckill.config import Settings
    from seckill.crowd.client import Credentials

    plan = _plan(
        buyers=buyers, late_buyers=late_buyers, duration_s=duration, units=units,
        per_buyer_limit=limit, hold_seconds=hold_seconds, concurrency=concurrency, pay=pay,
        fail=fail, cancel=cancel, replay=replay, seed=seed,
    )  # fmt: skip
    try:
        credentials = Credentials.from_settings(Settings(), admin_token=admin_token)
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    passed = _rehearse(
        "bench", url, plan, credentials, database_url=database_url, report_dir=report_dir
    )
    raise typer.Exit(0 if passed else 1)


def _plan(**options: Any) -> CrowdPlan:
    from seckill.crowd.plan import CrowdPlan

    try:
        return CrowdPlan(**options)
    except ValueError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None


def _rehearse(
    kind: str, url: str, plan: CrowdPlan, credentials: Credentials, **options: Any
) -> bool:
    import aiohttp

    from seckill.crowd.rehearsal import rehearse
    from seckill.crowd.sale import SaleRefused

    try:
        done = asyncio.run(rehearse(url, plan, credentials, kind=kind, console=console, **options))
    except (SaleRefused, aiohttp.ClientError) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    return done.result["passed"]


if __name__ == "__main__":
    app()
