"""The ``seckill`` command."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from seckill import __version__

app = typer.Typer(help="seckill: a flash-sale backend.", no_args_is_help=True, add_completion=False)
console = Console()


@app.callback()
def main() -> None:
    """Flash sales decided in Redis, one atomic script per purchase."""


@app.command()
def version() -> None:
    """Print the version."""
    console.print(f"seckill {__version__}")


@app.command()
def demo(
    buyers: int = typer.Option(2_000, min=1, help="Buyers in the first crowd."),
    units: int = typer.Option(100, min=1, help="Units on sale."),
    limit: int = typer.Option(2, min=1, help="Units one buyer may hold or buy."),
    hold_ms: int = typer.Option(1_500, min=100, help="How long a buyer has to pay, in ms."),
) -> None:
    """Run a scripted flash sale on the engine and print its verdict table."""
    from seckill.config import Settings
    from seckill.demo import DemoPlan

    settings = Settings()
    plan = DemoPlan(buyers=buyers, units=units, per_buyer_limit=limit, hold_ms=hold_ms)
    if settings.redis_url:
        passed = asyncio.run(_demo(settings, plan))
    else:
        # The demo's embedded Redis is throwaway: it never touches the real data directory.
        with tempfile.TemporaryDirectory(prefix="seckill-demo-") as scratch:
            passed = asyncio.run(
                _demo(settings.model_copy(update={"data_dir": Path(scratch)}), plan)
            )
    raise typer.Exit(0 if passed else 1)


async def _demo(settings: object, plan: object) -> bool:
    from seckill.bootstrap import open_runtime
    from seckill.config import Settings
    from seckill.demo import DemoPlan, run_demo

    assert isinstance(settings, Settings) and isinstance(plan, DemoPlan)
    async with open_runtime(settings) as runtime:
        info = await runtime.redis.info("server")
        where = "embedded, bundled" if runtime.embedded_redis else settings.redis_url
        console.print(
            f"[bold]Flash sale[/]: {plan.buyers:,} buyers for {plan.units:,} units, "
            f"limit {plan.per_buyer_limit} each, holds of {plan.hold_ms} ms "
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
