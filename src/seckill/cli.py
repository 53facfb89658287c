"""The ``seckill`` command: parse, resolve the settings once, call one service, print."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import os
import shutil
import sys
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer
from rich.console import Console

from seckill import __version__
from seckill.crowd.plan import CrowdPlan

if TYPE_CHECKING:
    from seckill.bootstrap import Runtime
    from seckill.config import Settings
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


# -- settings, once per process --------------------------------------------------------------


@functools.cache  # one invocation per process: read once, on first use
def _settings() -> Settings:
    from seckill.config import Settings

    return Settings()


def _setting_default(name: str) -> str:
    """For a flag's help: the setting that decides it when the flag is left out, and its
    default (one home for both: the Settings field)."""
    from seckill.config import Settings

    return f"default SECKILL_{name.upper()}, {Settings.model_fields[name].default}"


def _overridden(settings: Settings, **flags: object) -> Settings:
    """The settings, with each flag that was given (not None) in place of its setting."""
    return settings.model_copy(update={k: v for k, v in flags.items() if v is not None})


def _start_process(*, processes: int = 1) -> Settings:
    """Set up a server or worker process once: its metrics directory, then its logs.

    With SECKILL_METRICS_DIR, this process writes its metrics into files there, which every
    process of the deployment shares. prometheus_client picks its mode when first imported, so
    this runs before anything imports it (seckill.serve and the workers do).
    """
    from seckill.observability.logs import configure_logging

    settings = _settings()
    path = settings.metrics_dir
    if path is None and processes > 1:
        # The API's own processes still add up: a directory of its own, emptied at start.
        path = settings.data_dir / "metrics"
        shutil.rmtree(path, ignore_errors=True)
    if path is not None:
        if "prometheus_client" in sys.modules:
            raise RuntimeError(
                "prometheus_client was imported before PROMETHEUS_MULTIPROC_DIR was set"
            )
        path.mkdir(parents=True, exist_ok=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path.resolve())
    configure_logging(settings.log_format, settings.log_level)
    return settings


def _fail(message: object, code: int = 2) -> NoReturn:
    console.print(f"[red]error:[/] {message}")
    raise typer.Exit(code)


def _with_runtime(work: Callable[[Runtime], Awaitable[T]]) -> T:
    """Run ``work`` with everything wired from the settings; a refusal is a clear error."""
    from seckill.bootstrap import open_runtime
    from seckill.domain.outcomes import InvalidRequest
    from seckill.services.items import UnknownItem

    async def main() -> T:
        async with open_runtime(_settings()) as runtime:
            return await work(runtime)

    try:
        return asyncio.run(main())
    except (InvalidRequest, UnknownItem) as exc:
        _fail(exc)


def _item_cache(runtime: Runtime) -> ItemCache:
    from seckill.services.item_cache import ItemCache

    return ItemCache.from_settings(runtime.settings, engine=runtime.engine, source=runtime.ledger)


@app.callback()
def main() -> None:
    """Flash sales decided in Redis, one atomic script per purchase."""


@app.command()
def version() -> None:
    """Print the version."""
    console.print(f"seckill {__version__}")


# -- servers and workers ---------------------------------------------------------------------


def _run(settings: Settings, *, api: bool, workers: Iterable[str], **options: Any) -> None:
    """Run the API and/or workers on one event loop until SIGTERM (after ``_start_process``)."""
    from seckill.serve import WorkerKind, run_blocking

    try:
        run_blocking(settings, api=api, workers=[WorkerKind(w) for w in workers], **options)
    except OSError as exc:
        _fail(exc)


_HOST = typer.Option(None, help=f"Listen address ({_setting_default('api_host')}).")
_PORT = typer.Option(None, min=0, max=65535, help=f"Port ({_setting_default('api_port')}).")


@app.command()
def serve(host: str | None = _HOST, port: int | None = _PORT) -> None:
    """Run the API and all workers (persister, reaper, reconciler) in one process until SIGTERM."""
    settings = _overridden(_start_process(), api_host=host, api_port=port)
    _run(settings, api=True, workers=("persister", "reaper", "reconciler"))


class ApiServer(StrEnum):
    GRANIAN = "granian"
    UVICORN = "uvicorn"


_SERVER = typer.Option(
    None,
    "--server",
    help=f"What serves the API ({_setting_default('api_server')}: the faster floor in "
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
    """Run the API alone until SIGTERM (workers run apart: `seckill worker ...`)."""
    settings = _overridden(_start_process(processes=processes), api_host=host, api_port=port)
    chosen = ApiServer(server or settings.api_server)
    if chosen is ApiServer.UVICORN and processes == 1:
        _run(settings, api=True, workers=())
        return
    from seckill.serve import run_api_granian, run_api_processes

    run = run_api_granian if chosen is ApiServer.GRANIAN else run_api_processes
    try:
        run(settings, processes)
    except (OSError, ValueError) as exc:
        _fail(exc)


@worker_app.command("persister")
def worker_persister(
    batch_size: int | None = typer.Option(
        None, min=1, max=10_000, help="Entries landed per transaction (default: the persister's)."
    ),
    claim_idle_ms: int | None = typer.Option(
        None, min=10, help="Take over entries idle this long (default: the persister's)."
    ),
    max_deliveries: int | None = typer.Option(
        None, min=1, help="Deliveries before a dead letter (default: the persister's)."
    ),
) -> None:
    """Land every item stream's events in the database until SIGTERM."""
    settings = _start_process()
    # PersisterConfig is the one home of these defaults; its module imports prometheus_client,
    # so it is read only now, after _start_process.
    from seckill.workers.persister import PersisterConfig

    flags = dict(batch_size=batch_size, claim_idle_ms=claim_idle_ms, max_deliveries=max_deliveries)
    config = PersisterConfig(**{k: v for k, v in flags.items() if v is not None})
    _run(settings, api=False, workers=("persister",), persister=config)


@worker_app.command("reaper")
def worker_reaper(
    interval: float | None = typer.Option(
        None,
        min=0.01,
        help=f"Seconds between passes ({_setting_default('reaper_interval_seconds')}).",
    ),
) -> None:
    """Release holds past their deadline, every interval, until SIGTERM (replicas are safe)."""
    settings = _overridden(_start_process(), reaper_interval_seconds=interval)
    _run(settings, api=False, workers=("reaper",))


@worker_app.command("reconciler")
def worker_reconciler(
    interval: float | None = typer.Option(
        None,
        min=0.01,
        help=f"Seconds between passes ({_setting_default('reconcile_interval_seconds')}).",
    ),
    repair: bool | None = typer.Option(
        None,
        "--repair/--report-only",
        help=f"Repair what is found ({_setting_default('reconcile_repair')}).",
    ),
) -> None:
    """Compare every item's Redis and SQL records each interval, until SIGTERM.

    Logs the drift found and, with --repair, repairs it. Replicas are safe: one holds the
    upkeep lock and works.
    """
    settings = _overridden(
        _start_process(), reconcile_interval_seconds=interval, reconcile_repair=repair
    )
    _run(settings, api=False, workers=("reconciler",))


# -- operators' commands ---------------------------------------------------------------------


@app.command()
def token(
    buyer: str | None = typer.Option(None, help="Mint a buyer token for this buyer id."),
    admin: bool = typer.Option(False, "--admin", help="Mint an admin token."),
    ttl: int | None = typer.Option(
        None, min=1, help=f"Seconds ({_setting_default('token_ttl_seconds')})."
    ),
) -> None:
    """Print a bearer token, for tests and demos.

    Production tokens come from your identity provider, signed with the same key.
    """
    from seckill.domain.outcomes import InvalidRequest
    from seckill.security.tokens import Role, token_codec

    if (buyer is None) == (not admin):
        _fail("give exactly one of --buyer ID or --admin")
    settings = _settings()
    subject, role = (buyer, Role.BUYER) if buyer is not None else ("admin", Role.ADMIN)
    try:
        minted = token_codec(settings).mint(
            subject, role, ttl_seconds=ttl or settings.token_ttl_seconds
        )
    except (ValueError, InvalidRequest) as exc:
        _fail(exc)
    print(minted)


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Create or migrate the schema to the newest revision."""
    from seckill.store.database import open_database
    from seckill.store.migrate import upgrade

    async def main() -> None:
        database = open_database(_settings().effective_database_url)
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
    limit: int | None = typer.Option(
        None,
        min=1,
        help=f"Units one buyer may hold or buy ({_setting_default('per_buyer_limit')}).",
    ),
    hold_seconds: int | None = typer.Option(
        None, min=1, help=f"Time a buyer has to pay ({_setting_default('hold_seconds')})."
    ),
) -> None:
    """Create an item in the database and its card (warm it to put it on sale)."""
    from seckill.services.items import create_item

    start = _when(starts_at, "--starts-at") if starts_at else datetime.now(UTC)
    end = _when(ends_at, "--ends-at") if ends_at else start + timedelta(hours=1)

    item_id = _with_runtime(
        lambda rt: create_item(
            rt.ledger, _item_cache(rt), rt.settings, name=name, price_cents=price_cents,
            total=total, starts_at=start, ends_at=end, per_buyer_limit=limit,
            hold_seconds=hold_seconds,
        )
    )  # fmt: skip
    console.print(f"created item {item_id}")


@item_app.command("warm")
def item_warm(
    item_id: int = typer.Argument(..., min=1),
    force: bool = typer.Option(False, help="Replace the settings of an item with holds or sales."),
) -> None:
    """Load an item from the database into Redis, putting it on sale (and its cached card)."""
    from seckill.services.items import warm_item

    outcome = _with_runtime(
        lambda rt: warm_item(rt.engine, rt.ledger, item_id, force=force, cache=_item_cache(rt))
    )
    console.print(f"item {item_id}: {outcome}")


@app.command()
def warm(
    force: bool = typer.Option(False, help="Reload items with holds or sales too; they keep them."),
) -> None:
    """Warm every item whose sale has not ended, into Redis and its cached card.

    Redis is where it is sold; the card is what buyers read. Items already selling are kept
    as they are unless --force.
    """
    from seckill.cli_output import print_warmed
    from seckill.services.items import warm_items

    now = datetime.now(UTC)
    warmed = _with_runtime(
        lambda rt: warm_items(rt.engine, rt.ledger, _item_cache(rt), now=now, force=force)
    )
    if not print_warmed(console, warmed):
        raise typer.Exit(1)


@app.command()
def reconcile(
    items: list[int] = typer.Argument(None, help="Item ids (default: every item on sale)."),
    repair: bool = typer.Option(False, "--repair", help="Repair the drift found (journaled)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Prove Redis and SQL agree, item by item, while the sale runs.

    Exit code 1 if drift is found (with --repair: if any is left after repairing), 0 otherwise.
    """
    from seckill.cli_output import print_report, report_json
    from seckill.reconcile.reconciler import ItemReport, Reconciler

    async def work(runtime: Runtime) -> list[ItemReport]:
        grace_ms = int(runtime.settings.reconcile_grace_seconds * 1000)
        reconciler = Reconciler(runtime.engine, runtime.ledger, grace_ms=grace_ms)
        chosen = items or await reconciler.item_ids()
        return [await reconciler.reconcile(item_id, repair=repair) for item_id in chosen]

    reports = _with_runtime(work)
    if as_json:
        print(json.dumps([report_json(r) for r in reports], indent=2))
    else:
        for report in reports:
            print_report(console, report)
    if any(report.left for report in reports):
        raise typer.Exit(1)


@app.command()
def recover(item_id: int = typer.Argument(..., help="The item to rebuild in Redis.")) -> None:
    """Rebuild an item's Redis state from SQL after Redis lost it.

    After a restart empty, an older AOF or a failover: counters, live holds with their
    deadlines, buyers' units. What Redis still has beyond SQL is kept; the sale goes on with no
    unit sold twice.
    """
    from seckill.reconcile.recovery import recover_item

    done = _with_runtime(lambda rt: recover_item(rt.engine, rt.ledger, item_id))
    s = done.stock
    console.print(
        f"item {item_id} recovered: {done.restored} holds restored from SQL, "
        f"{done.advanced} moved forward, {done.conflicts} conflicts (SQL kept); "
        f"available {s.available}, held {s.held}, sold {s.sold} of {s.total}"
    )


@dead_app.command("list")
def dead_letters_list(
    everything: bool = typer.Option(False, "--all", help="Include replayed ones."),
) -> None:
    """Show dead letters with their errors."""
    from seckill.cli_output import print_dead_letters
    from seckill.services.dead_letters import list_dead_letters

    letters = _with_runtime(lambda rt: list_dead_letters(rt.ledger, include_replayed=everything))
    print_dead_letters(console, letters)


@dead_app.command("replay")
def dead_letters_replay(
    ids: list[int] = typer.Argument(None, help="Dead letter ids (default: every pending one)."),
) -> None:
    """Land dead letters again (after fixing what made them fail); each lands once at most."""
    from seckill.cli_output import print_replay
    from seckill.services.dead_letters import replay_dead_letters

    done = _with_runtime(lambda rt: replay_dead_letters(rt.ledger, ids or ()))
    print_replay(console, done)
    if not done.ok:
        raise typer.Exit(1)


# -- rehearsing a sale -----------------------------------------------------------------------

_PLAN = {f.name: f.default for f in dataclasses.fields(CrowdPlan)}  # the crowd's defaults
_REPORT_DIR = typer.Option(
    Path("seckill-reports"), help="Where the JSON result and the HTML report are written."
)
_CONCURRENCY = typer.Option(_PLAN["concurrency"], min=1, help="Buyers in flight at once.")
_LIMIT = typer.Option(_PLAN["per_buyer_limit"], min=1, help="Units one buyer may hold or buy.")
_HOLD = typer.Option(_PLAN["hold_seconds"], min=1, help="Seconds a buyer has to pay.")
_UNITS = typer.Option(_PLAN["units"], min=1, help="Units on sale.")


@app.command()
def demo(
    buyers: int = typer.Option(_PLAN["buyers"], min=1, help="Buyers in the first crowd."),
    units: int = _UNITS,
    limit: int = _LIMIT,
    hold_seconds: int = _HOLD,
    concurrency: int = _CONCURRENCY,
    report_dir: Path = _REPORT_DIR,
) -> None:
    """A live flash sale on embedded defaults, rushed by a crowd over HTTP, and its verdict.

    Exit 1 if any check fails.
    """
    from seckill.demo import run_demo

    plan = _plan(
        buyers=buyers, units=units, per_buyer_limit=limit, hold_seconds=hold_seconds,
        concurrency=concurrency,
    )  # fmt: skip
    console.print(
        f"[bold]Flash sale[/]: {plan.buyers:,} buyers (then {plan.late_crowd:,} late ones) for "
        f"{plan.units:,} units, limit {plan.per_buyer_limit} each, holds of {plan.hold_seconds} s,"
        f" {plan.concurrency} in flight"
    )
    _verdict(lambda: run_demo(plan, report_dir=report_dir, console=console))


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
        _PLAN["buyers"], min=1, help="Buyers in the first crowd (a cap with --duration)."
    ),
    late_buyers: int | None = typer.Option(
        _PLAN["late_buyers"],
        min=0,
        help="Buyers for the units that come back (default: a quarter of --buyers).",
    ),
    duration: float | None = typer.Option(
        _PLAN["duration_s"],
        min=0.1,
        help="Seconds the first crowd keeps arriving (default: until --buyers).",
    ),
    units: int = _UNITS,
    limit: int = _LIMIT,
    hold_seconds: int = _HOLD,
    concurrency: int = _CONCURRENCY,
    pay: float = typer.Option(_PLAN["pay"], min=0, max=1, help="Share of holds paid."),
    fail: float = typer.Option(
        _PLAN["fail"], min=0, max=1, help="Share of holds whose payment fails."
    ),
    cancel: float = typer.Option(_PLAN["cancel"], min=0, max=1, help="Share of holds cancelled."),
    replay: float = typer.Option(
        _PLAN["replay"], min=0, max=1, help="Share of buyers who click twice."
    ),
    seed: int = typer.Option(_PLAN["seed"], help="The crowd's random seed."),
    report_dir: Path = _REPORT_DIR,
) -> None:
    """Rehearse a sale against a running deployment and print the verdict.

    A new item, the crowd over HTTP, per outcome req/s and latency, then the verdict (exit 1 if
    any check fails, 2 if the sale could not be set up). Buyer tokens and payment notices are
    signed with the deployment's keys, read from the same SECKILL_* settings it runs with.
    """
    from seckill.crowd.client import Credentials
    from seckill.crowd.rehearsal import rehearse

    plan = _plan(
        buyers=buyers, late_buyers=late_buyers, duration_s=duration, units=units,
        per_buyer_limit=limit, hold_seconds=hold_seconds, concurrency=concurrency, pay=pay,
        fail=fail, cancel=cancel, replay=replay, seed=seed,
    )  # fmt: skip
    try:
        credentials = Credentials.from_settings(_settings(), admin_token=admin_token)
    except ValueError as exc:
        _fail(exc)

    def run() -> bool:
        rehearsal = rehearse(
            url, plan, credentials, kind="bench", console=console, database_url=database_url,
            report_dir=report_dir,
        )  # fmt: skip
        return asyncio.run(rehearsal).result["passed"]

    _verdict(run)


def _plan(**options: Any) -> CrowdPlan:
    try:
        return CrowdPlan(**options)
    except ValueError as exc:
        _fail(exc)


def _verdict(rehearse: Callable[[], bool]) -> NoReturn:
    """Exit 0 if the rehearsal's verdicts all pass, 1 if one fails, 2 if it could not run."""
    import aiohttp

    from seckill.crowd.sale import SaleRefused
    from seckill.demo import ServerFailed

    try:
        passed = rehearse()
    except (ServerFailed, SaleRefused, aiohttp.ClientError) as exc:
        _fail(exc)
    raise typer.Exit(0 if passed else 1)


if __name__ == "__main__":
    app()
