"""``seckill item`` (create, warm, list, archive) and ``seckill warm``: items are created in SQL,
the record, and warmed into Redis, where they are sold."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import typer

from seckill.cli.common import (
    console,
    setting_default,
    with_runtime,
)
from seckill.domain.rules import MAX_STOCK_SHARDS

if TYPE_CHECKING:
    from seckill.bootstrap.runtime import Runtime
    from seckill.services.archive import Archiving, Archivist
    from seckill.services.item_cache import ItemCache

commands = typer.Typer(help="Items: created in SQL, warmed into Redis.", no_args_is_help=True)
warm_commands = typer.Typer()


def item_cache(runtime: Runtime) -> ItemCache:
    from seckill.bootstrap.services import item_cache

    return item_cache(runtime, source=runtime.ledger)


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


@commands.command("create")
def item_create(
    name: str = typer.Option(..., help="What buyers see."),
    price_cents: int = typer.Option(
        ..., min=0, help="Price of one unit, in minor units (cents) of its currency."
    ),
    currency: str | None = typer.Option(
        None, help=f"ISO 4217 code of the price ({setting_default('currency')})."
    ),
    total: int = typer.Option(..., min=0, help="Units on sale."),
    starts_at: str = typer.Option("", help="Sale start, ISO 8601 with zone (default: now)."),
    ends_at: str = typer.Option("", help="Sale end, ISO 8601 with zone (default: start + 1 h)."),
    limit: int | None = typer.Option(
        None,
        min=1,
        help=f"Units one buyer may hold or buy ({setting_default('per_buyer_limit')}).",
    ),
    hold_seconds: int | None = typer.Option(
        None, min=1, help=f"Time a buyer has to pay ({setting_default('hold_seconds')})."
    ),
    stock_shards: int | None = typer.Option(
        None,
        min=1,
        max=MAX_STOCK_SHARDS,
        help="Redis slots the stock is split over, so several primaries sell one item "
        f"({setting_default('stock_shards')}).",
    ),
    waiting_room: bool | None = typer.Option(
        None,
        "--waiting-room/--no-waiting-room",
        help="Buyers queue first and get a ticket when their turn comes "
        f"({setting_default('waiting_room')}).",
    ),
    queue_admit_per_second: int | None = typer.Option(
        None,
        min=0,
        help="The waiting room's positions let in per second, 0 for no rate cap "
        "(default: the server's SECKILL_QUEUE_ADMIT_PER_SECOND when it sells).",
    ),
    queue_open_seconds: int | None = typer.Option(
        None,
        min=0,
        help="Seconds before the sale the waiting room opens "
        "(default: the server's SECKILL_QUEUE_OPEN_SECONDS when it sells).",
    ),
) -> None:
    """Create an item in the database and its card (warm it to put it on sale)."""
    from seckill.bootstrap.services import item_defaults
    from seckill.services.items import create_item

    start = _when(starts_at, "--starts-at") if starts_at else datetime.now(UTC)
    end = _when(ends_at, "--ends-at") if ends_at else start + timedelta(hours=1)

    item_id = with_runtime(
        lambda rt: create_item(
            rt.ledger, item_cache(rt), item_defaults(rt.settings), name=name,
            price_cents=price_cents,
            total=total, starts_at=start, ends_at=end, per_buyer_limit=limit,
            hold_seconds=hold_seconds, stock_shards=stock_shards, waiting_room=waiting_room,
            queue_admit_per_second=queue_admit_per_second, queue_open_seconds=queue_open_seconds,
            currency=currency,
        )
    )  # fmt: skip
    console.print(f"created item {item_id}")


@commands.command("warm")
def item_warm(
    item_id: int = typer.Argument(..., min=1),
    force: bool = typer.Option(False, help="Replace the settings of an item with holds or sales."),
) -> None:
    """Load an item from the database into Redis, putting it on sale (and its cached card)."""
    from seckill.services.items import warm_item

    outcome = with_runtime(
        lambda rt: warm_item(rt.engine, rt.ledger, item_id, force=force, cache=item_cache(rt))
    )
    console.print(f"item {item_id}: {outcome}")


def archivist(runtime: Runtime) -> Archivist:

    from seckill.bootstrap.services import archivist

    return archivist(runtime)


@commands.command("list")
def item_list() -> None:
    """Every item with its stage: scheduled, on_sale, ended, settled or archived (and, for an
    ended item, what is left to settle)."""
    from seckill.cli.output import print_stages

    print_stages(console, with_runtime(lambda rt: archivist(rt).stages()))


@commands.command("archive")
def item_archive(item_id: int = typer.Argument(..., min=1)) -> None:
    """Archive a settled item now (its grace period waived): its keys leave Redis, SQL keeps
    it and answers for it. Refused, with the reasons, while anything is unsettled (exit 1)."""
    from seckill.cli.output import print_archiving

    async def work(runtime: Runtime) -> Archiving:
        return await archivist(runtime).archive(item_id, waive_grace=True)

    done = with_runtime(work)
    print_archiving(console, done)
    if not done.removed:
        raise typer.Exit(1)


@warm_commands.command()
def warm(
    force: bool = typer.Option(False, help="Reload items with holds or sales too; they keep them."),
) -> None:
    """Warm every item whose sale has not ended, into Redis and its cached card.

    Redis is where it is sold; the card is what buyers read. Items already selling are kept
    as they are unless --force.
    """
    from seckill.cli.output import print_warmed
    from seckill.services.items import warm_items

    now = datetime.now(UTC)
    warmed = with_runtime(
        lambda rt: warm_items(rt.engine, rt.ledger, item_cache(rt), now=now, force=force)
    )
    if not print_warmed(console, warmed):
        raise typer.Exit(1)
