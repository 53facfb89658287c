"""``seckill reconcile`` and ``seckill recover``: Redis proved against SQL, item by item, and an
item rebuilt from SQL after Redis lost it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer

from seckill.cli.common import (
    console,
    with_runtime,
)

if TYPE_CHECKING:
    from seckill.bootstrap.runtime import Runtime

commands = typer.Typer()


@commands.command()
def reconcile(
    items: list[int] = typer.Argument(None, help="Item ids (default: every item on sale)."),
    repair: bool = typer.Option(False, "--repair", help="Repair the drift found (journaled)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Prove Redis and SQL agree, item by item, while the sale runs.

    Exit code 1 if drift is found (with --repair: if any is left after repairing), 0 otherwise.
    """
    from seckill.bootstrap.services import reconciler
    from seckill.cli.output import print_report, report_json
    from seckill.services.reconcile.reconciler import ItemReport

    async def work(runtime: Runtime) -> list[ItemReport]:
        chosen = reconciler(runtime)
        return await chosen.reconcile_many(items or await chosen.item_ids(), repair=repair)

    reports = with_runtime(work)
    if as_json:
        print(json.dumps([report_json(r) for r in reports], indent=2))
    else:
        for report in reports:
            print_report(console, report)
    if any(report.left for report in reports):
        raise typer.Exit(1)


@commands.command()
def recover(item_id: int = typer.Argument(..., help="The item to rebuild in Redis.")) -> None:
    """Rebuild an item's Redis state from SQL after Redis lost it.

    After a restart empty, an older AOF or a failover: counters, live holds with their
    deadlines, buyers' units. What Redis still has beyond SQL is kept; the sale goes on with no
    unit sold twice.
    """
    from seckill.services.reconcile.recovery import recover_item

    done = with_runtime(lambda rt: recover_item(rt.engine, rt.ledger, item_id))
    s = done.stock
    console.print(
        f"item {item_id} recovered: {done.restored} holds restored from SQL, "
        f"{done.advanced} moved forward, {done.conflicts} conflicts (SQL kept); "
        f"available {s.available}, held {s.held}, sold {s.sold} of {s.total}"
    )
