"""The ``seckill`` command."""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from seckill import __version__

if TYPE_CHECKING:
    from seckill.bootstrap import Runtime
    from seckill.config import Settings
    from seckill.demo import DemoPlan

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
    from seckill.catalog import UnknownItem
    from seckill.config import Settings
    from seckill.domain.outcomes import InvalidRequest

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
    from seckill.store.ledger import NewItem

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
    """Load an item from the database into Redis, putting it on sale."""
    from seckill.catalog import warm_item

    async def work(runtime: Runtime) -> str:
        return await warm_item(runtime.engine, runtime.ledger, item_id, force=force)

    console.print(f"item {item_id}: {_with_runtime(work)}")


@worker_app.command("persister")
def worker_persister(
    batch_size: int = typer.Option(500, min=1, max=10_000),
    claim_idle_ms: int = typer.Option(30_000, min=10, help="Take over entries idle this long."),
    max_deliveries: int = typer.Option(5, min=1, help="Deliveries before a dead letter."),
) -> None:
    """Land every item stream's events in the database until SIGTERM."""
    from seckill.workers.loop import run_until_stopped, stop_on_signals
    from seckill.workers.persister import Persister, PersisterConfig

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config = PersisterConfig(
        batch_size=batch_size, claim_idle_ms=claim_idle_ms, max_deliveries=max_deliveries
    )

    async def work(runtime: Runtime) -> None:
        stop = asyncio.Event()
        stop_on_signals(stop)
        persister = Persister(
            redis=runtime.redis,
            ledger=runtime.ledger,
            prefix=runtime.settings.key_prefix,
            config=config,
            stop=stop,
        )
        logging.getLogger("seckill").info("persister %s started", persister.consumer)
        await run_until_stopped(persister, stop)
        logging.getLogger("seckill").info("persister stopped after %d entries", persister.landed)

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


@app.command()
def demo(
    buyers: int = typer.Option(2_000, min=1, help="Buyers in the first crowd."),
    units: int = typer.Option(100, min=1, help="Units on sale."),
    limit: int = typer.Option(2, min=1, help="Units one buyer may hold or buy."),
    hold_seconds: int = typer.Option(2, min=1, help="How long a buyer has to pay."),
) -> None:
    """Run a scripted flash sale (Redis, then SQL) and print its verdict table."""
    from seckill.config import Settings
    from seckill.demo import DemoPlan

    settings = Settings()
    plan = DemoPlan(buyers=buyers, units=units, per_buyer_limit=limit, hold_seconds=hold_seconds)
    if settings.redis_url:
        passed = asyncio.run(_demo(settings, plan))
    else:
        # The demo's embedded Redis is throwaway: it never touches the real data directory.
        with tempfile.TemporaryDirectory(prefix="seckill-demo-") as scratch:
            passed = asyncio.run(
                _demo(settings.model_copy(update={"data_dir": Path(scratch)}), plan)
            )
    raise typer.Exit(0 if passed else 1)


async def _demo(settings: Settings, plan: DemoPlan) -> bool:
    from seckill.bootstrap import open_runtime
    from seckill.demo import run_demo

    async with open_runtime(settings) as runtime:
        info = await runtime.redis.info("server")
        where = "embedded, bundled" if runtime.embedded_redis else settings.redis_url
        console.print(
            f"[bold]Flash sale[/]: {plan.buyers:,} buyers for {plan.units:,} units, "
            f"limit {plan.per_buyer_limit} each, holds of {plan.hold_seconds} s "
            f"(Redis {info['redis_version']}, {where})"
        )
        with console.status("buyers are rushing in..."):
            report = await run_demo(runtime, plan)

    outcomes = Table(title=f"Answers (item {report.item_id})")
    outcomes.add_column("outcome")
    outcomes.add_column("requests", justify="right")
    for outcome, count in report.outcomes.most_common():
        outcomes.add_row(outcome.value, f"{count:,}")
    console.print(outcomes)
    console.print(
        f"{len(report.latencies_ms):,} reservation requests at "
        f"{report.reservations_per_s:,.0f}/s; latency (waiting for a connection included) "
        f"p50 {report.latency_ms(0.5):.2f} ms, "
        f"p99 {report.latency_ms(0.99):.2f} ms"
    )
    verdicts = Table(title="Verdict")
    verdicts.add_column("check")
    verdicts.add_column("result")
    verdicts.add_column("detail")
    for check in report.checks:
        verdicts.add_row(check.name, "[green]pass[/]" if check.ok else "[red]FAIL[/]", check.detail)
    console.print(verdicts)
    console.print(
        "[bold green]All checks pass.[/]" if report.passed else "[bold red]Checks failed.[/]"
    )
    return report.passed


if __name__ == "__main__":
    app()
