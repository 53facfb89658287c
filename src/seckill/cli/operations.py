"""What an operator does to a deployment: tokens, the schema, items, reconciling, recovering,
dead letters."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import typer

from seckill.cli.common import (
    abort,
    checked_settings,
    console,
    current_settings,
    setting_default,
    with_runtime,
)
from seckill.domain.rules import MAX_STOCK_SHARDS

if TYPE_CHECKING:
    from seckill.bootstrap.runtime import Runtime
    from seckill.services.archive import Archiving, Archivist
    from seckill.services.dead_letters import Settled
    from seckill.services.item_cache import ItemCache

commands = typer.Typer()
db_commands = typer.Typer(help="The SQL database.", no_args_is_help=True)
item_commands = typer.Typer(help="Items: created in SQL, warmed into Redis.", no_args_is_help=True)
dead_letter_commands = typer.Typer(
    help="Stream entries the persister or a bridge gave up on.", no_args_is_help=True
)
refund_commands = typer.Typer(
    help="Refunds owed: successful charges that paid nothing.", no_args_is_help=True
)
config_commands = typer.Typer(help="The settings.", no_args_is_help=True)
group_commands = typer.Typer(
    help="The consumer groups that follow every item stream (the persister, each bridge).",
    no_args_is_help=True,
)


def item_cache(runtime: Runtime) -> ItemCache:
    from seckill.bootstrap.services import item_cache

    return item_cache(runtime, source=runtime.ledger)


@commands.command()
def token(
    buyer: str | None = typer.Option(None, help="Mint a buyer token for this buyer id."),
    admin: bool = typer.Option(False, "--admin", help="Mint an admin token."),
    ttl: int | None = typer.Option(
        None, min=1, help=f"Seconds ({setting_default('token_ttl_seconds')})."
    ),
) -> None:
    """Print a bearer token, for tests and demos.

    Production tokens come from your identity provider, signed with the same key.
    """
    from seckill.domain.outcomes import InvalidRequest
    from seckill.security.tokens import Role, token_codec

    if (buyer is None) == (not admin):
        abort("give exactly one of --buyer ID or --admin")
    settings = checked_settings()
    subject, role = (buyer, Role.BUYER) if buyer is not None else ("admin", Role.ADMIN)
    try:
        minted = token_codec(settings).mint(
            subject, role, ttl_seconds=ttl or settings.token_ttl_seconds
        )
    except (ValueError, InvalidRequest) as exc:
        abort(exc)
    print(minted)


@config_commands.command("check")
def config_check() -> None:
    """Print the effective settings (keys and passwords masked) and what keeps them from
    running under their profile: exit 0 when nothing does, 2 otherwise. For a deploy pipeline,
    before anything starts."""
    from seckill.bootstrap.checks import configuration_problems
    from seckill.config import masked

    settings = current_settings()
    for name in type(settings).model_fields:
        shown = masked(name, getattr(settings, name))
        console.print(f"SECKILL_{name.upper()}={shown}", markup=False, highlight=False)
    problems = configuration_problems(settings)
    if problems:
        for problem in problems:
            console.print(f"[red]problem:[/] {problem}", highlight=False, soft_wrap=True)
        raise typer.Exit(2)
    console.print(f"[green]ok:[/] the {settings.profile} profile can start", highlight=False)


@config_commands.command("docs")
def config_docs() -> None:
    """Print the configuration reference (docs/operations/configuration.md): every setting,
    its variable, default and meaning."""
    from seckill.config import settings_reference

    typer.echo(settings_reference(), nl=False)


@db_commands.command("upgrade")
def db_upgrade() -> None:
    """Create or migrate the schema to the newest revision."""
    from seckill.cli.common import database_trouble
    from seckill.store.database import open_database
    from seckill.store.migrate import NewerSchema, upgrade
    from seckill.tls import database_ssl_context

    settings = checked_settings(tokens=False)  # the profile's refusal first: no file made
    tls = database_ssl_context(settings)

    async def main() -> None:
        database = open_database(settings.effective_database_url, tls=tls)
        try:
            await upgrade(database, currency=settings.currency)
        finally:
            await database.dispose()

    try:
        asyncio.run(main())
    except NewerSchema as exc:
        abort(exc)
    except Exception as exc:
        trouble = database_trouble(exc)
        if trouble is None:
            raise
        abort(trouble)
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


@item_commands.command("create")
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
    from seckill.services.items import create_item

    start = _when(starts_at, "--starts-at") if starts_at else datetime.now(UTC)
    end = _when(ends_at, "--ends-at") if ends_at else start + timedelta(hours=1)

    item_id = with_runtime(
        lambda rt: create_item(
            rt.ledger, item_cache(rt), rt.settings, name=name, price_cents=price_cents,
            total=total, starts_at=start, ends_at=end, per_buyer_limit=limit,
            hold_seconds=hold_seconds, stock_shards=stock_shards, waiting_room=waiting_room,
            queue_admit_per_second=queue_admit_per_second, queue_open_seconds=queue_open_seconds,
            currency=currency,
        )
    )  # fmt: skip
    console.print(f"created item {item_id}")


@item_commands.command("warm")
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


@item_commands.command("list")
def item_list() -> None:
    """Every item with its stage: scheduled, on_sale, ended, settled or archived (and, for an
    ended item, what is left to settle)."""
    from seckill.cli.output import print_stages

    print_stages(console, with_runtime(lambda rt: archivist(rt).stages()))


@item_commands.command("archive")
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


@commands.command()
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


GROUP_HELP = "One group's only: persister, or a bridge's (bridge-rabbitmq, bridge-nats)."


@dead_letter_commands.command("list")
def dead_letters_list(
    group: str | None = typer.Option(None, help=GROUP_HELP),
    everything: bool = typer.Option(False, "--all", help="Include replayed and dropped ones."),
) -> None:
    """Show dead letters with their errors: the persister's (in SQL) and the bridges' (on the
    items' dead-letter streams)."""
    from seckill.cli.output import print_dead_letters
    from seckill.services.dead_letters import list_dead_letters

    letters = with_runtime(
        lambda rt: list_dead_letters(rt.ledger, rt.engine, group=group, include_settled=everything)
    )
    print_dead_letters(console, letters)


@dead_letter_commands.command("replay")
def dead_letters_replay(
    ids: list[str] = typer.Argument(None, help="Dead letter ids (default: every pending one)."),
    group: str | None = typer.Option(None, help=GROUP_HELP),
    to: str | None = typer.Option(
        None, help="The broker for a bridge's letters (default SECKILL_BRIDGE_URL)."
    ),
) -> None:
    """Replay dead letters once what made them fail is fixed: the persister's land in SQL, a
    bridge's are published to its broker again. Each is replayed once at most."""
    from seckill.cli.output import print_settled
    from seckill.services.dead_letters import replay_dead_letters
    from seckill.sinks import sink_from_url

    url = to or current_settings().bridge_url
    try:
        sink = sink_from_url(url) if url else None
    except ValueError as exc:
        abort(exc)

    async def replay(runtime: Runtime) -> Settled:
        try:
            return await replay_dead_letters(
                runtime.ledger, runtime.engine, ids or (), group=group, sink=sink
            )
        finally:
            if sink is not None:
                await sink.close()

    done = with_runtime(replay)
    print_settled(console, done, "replayed")
    if not done.ok:
        raise typer.Exit(1)


@dead_letter_commands.command("drop")
def dead_letters_drop(
    ids: list[str] = typer.Argument(..., help="Dead letter ids."),
    group: str | None = typer.Option(None, help=GROUP_HELP),
) -> None:
    """Give up on dead letters for good (what they carry never lands or reaches the broker):
    the persister's stay in SQL, marked dropped; a bridge's leave the dead-letter stream."""
    from seckill.cli.output import print_settled
    from seckill.services.dead_letters import drop_dead_letters

    done = with_runtime(lambda rt: drop_dead_letters(rt.ledger, rt.engine, ids, group=group))
    print_settled(console, done, "dropped")
    if not done.ok:
        raise typer.Exit(1)


@group_commands.command("list")
def groups_list() -> None:
    """The registered groups: each is made on every item stream, and trimming waits for it."""
    from seckill.services.stream_groups import list_groups

    groups = with_runtime(lambda rt: list_groups(rt.engine, rt.ledger))
    for group in groups:
        console.print(group, markup=False)
    if not groups:  # a reader registers its group as it starts
        console.print("no group registered yet: no persister or bridge has run")


@group_commands.command("retire")
def groups_retire(
    group: str = typer.Argument(..., help="A bridge's group: bridge-<sink>."),
) -> None:
    """Take a group out of service for good (a bridge no longer run): off the registry (Redis's
    and SQL's) and every item stream, so the streams stop keeping what it never reads. Stop its
    workers first: a running one registers it again."""
    from seckill.services.stream_groups import retire

    left = with_runtime(lambda rt: retire(rt.engine, rt.ledger, group))
    console.print(f"{group} retired: it left {left} item streams", markup=False)


@refund_commands.command("list")
def refunds_list(
    item: int | None = typer.Option(None, min=1, help="One item's refunds only."),
    state: str | None = typer.Option(None, help="owed or refunded (default: both)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON lines instead of a table."),
) -> None:
    """Every refund, newest first: the charges that paid nothing (the order released first, or
    paid by another payment), with the amount to give back."""
    from seckill.cli.output import print_refunds, refund_json
    from seckill.domain.money import RefundState
    from seckill.services.refunds import list_refunds
    from seckill.store.records import RefundRecord

    try:
        wanted = RefundState(state) if state else None
    except ValueError:
        raise typer.BadParameter("owed or refunded", param_hint="--state") from None

    async def every(runtime: Runtime) -> list[RefundRecord]:
        found: list[RefundRecord] = []
        cursor = None
        while True:
            page = await list_refunds(
                runtime.ledger, item_id=item, state=wanted, cursor=cursor, limit=500
            )
            found += page.refunds
            if page.next_cursor is None:
                return found
            cursor = page.next_cursor

    refunds = with_runtime(every)
    if as_json:
        for refund in refunds:
            print(json.dumps(refund_json(refund)))
    else:
        print_refunds(console, refunds)


@refund_commands.command("mark")
def refunds_mark(
    item_id: int = typer.Argument(..., min=1, help="The item the payment was for."),
    payment_id: str = typer.Argument(..., help="The payment whose money was given back."),
) -> None:
    """Mark a refund given back (once: marking it again keeps the first time). Exit 1 when no
    refund is owed for that payment."""
    from seckill.domain.outcomes import InvalidRequest
    from seckill.services.refunds import RefundNotFound, mark_refunded

    try:
        marked = with_runtime(lambda rt: mark_refunded(rt.ledger, item_id, payment_id))
    except (RefundNotFound, InvalidRequest) as exc:
        abort(exc, code=1)
    assert marked.refunded_at is not None
    console.print(
        f"payment {payment_id} of item {item_id}: refunded at "
        f"{marked.refunded_at.isoformat(timespec='seconds')} "
        f"({marked.charged} to {marked.buyer or 'the payer'}, order {marked.order_id})"
    )
