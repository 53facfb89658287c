"""How ``seckill`` shows its answers: the tables and reports its commands print.

Kept apart from the commands so that each reads as what it does (parse, call one service,
print), while the rows and columns of what it prints live here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from seckill.domain.lifecycle import Stage, described
from seckill.domain.outcomes import ErrorCode

if TYPE_CHECKING:
    from seckill.domain.dead_letters import DeadLetter
    from seckill.domain.items import ItemRecord, Stock
    from seckill.services.archive import Archiving, Settlement
    from seckill.services.dead_letters import Settled
    from seckill.services.items import WarmedItem
    from seckill.services.reconcile.reconciler import ItemReport
    from seckill.store.records import RefundRecord


def print_warmed(console: Console, warmed: Sequence[WarmedItem]) -> bool:
    """One row per item warmed; False if the engine refused one (other than keeping an item
    already selling)."""
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
    return not refused


def print_stages(console: Console, stages: Sequence[tuple[ItemRecord, Settlement]]) -> None:
    """One row per item: its window, its stage, and what keeps an ended item from archiving."""
    table = Table(title=f"{len(stages)} item(s)")
    for column in ("item", "name", "starts at", "ends at", "stage", "why not archived yet"):
        table.add_column(column)
    for record, settled in stages:
        why = described(settled.hindrances)
        if settled.archived_at is not None:
            why = f"archived at {settled.archived_at.isoformat(timespec='seconds')}"
        table.add_row(
            str(record.item_id), record.name, record.starts_at.isoformat(timespec="seconds"),
            record.ends_at.isoformat(timespec="seconds"), settled.stage.value, why,
        )  # fmt: skip
    console.print(table)


def print_archiving(console: Console, done: Archiving) -> None:
    if done.removed:
        console.print(f"item {done.item_id} archived: Redis holds none of it; SQL answers for it")
        return
    why = described(done.hindrances)
    if done.stage is Stage.ARCHIVED:
        console.print(f"item {done.item_id} archived in SQL; its keys leave Redis once: {why}")
    else:
        console.print(f"[red]item {done.item_id} not archived[/] (stage {done.stage}): {why}")


def _ttl(ms: int | None) -> str:
    if ms is None:
        return "[red]no card[/]"
    return "never" if ms < 0 else str(timedelta(seconds=ms // 1000))


def report_json(report: ItemReport) -> dict[str, object]:
    """A reconciler's report on one item, as ``seckill reconcile --json`` prints it."""

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


def print_report(console: Console, report: ItemReport) -> None:
    """A reconciler's report on one item: the verdict, then what was found and repaired."""

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


def print_dead_letters(console: Console, letters: Sequence[DeadLetter]) -> None:
    """One row per dead letter, with its error and what a person did with it."""
    table = Table(title="Dead letters")
    for column in ("id", "group", "stream", "entry", "deliveries", "died", "error", "settled"):
        table.add_column(column)
    for d in letters:
        settled = ""
        if d.replayed_at:
            settled = f"replayed {d.replayed_at.isoformat(timespec='seconds')}"
        elif d.dropped_at:
            settled = f"dropped {d.dropped_at.isoformat(timespec='seconds')}"
        table.add_row(
            d.id, d.group, d.stream, d.entry_id, str(d.deliveries),
            d.died_at.isoformat(timespec="seconds"), d.error, settled,
        )  # fmt: skip
    console.print(table)


def print_settled(console: Console, settled: Settled, done: str) -> None:
    """The ids that name no pending dead letter, then one line per dead letter tried."""
    for dead_id in settled.missing:
        console.print(f"[red]{dead_id}[/]: no pending dead letter with this id")
    for letter in settled.letters:
        if letter.refused is None:
            console.print(f"[green]{letter.id}[/]: {done}")
        else:
            console.print(f"[red]{letter.id}[/]: {letter.refused}")


def print_refunds(console: Console, refunds: Sequence[RefundRecord]) -> None:
    """One row per refund, newest first, with what it amounts to and whether it was given."""
    table = Table(title="Refunds")
    for column in ("item", "payment", "order", "buyer", "amount", "reason", "owed", "refunded"):
        table.add_column(column)
    for r in refunds:
        refunded = r.refunded_at.isoformat(timespec="seconds") if r.refunded_at else ""
        table.add_row(
            str(r.item_id), r.payment_id, str(r.order_id), r.buyer or "",
            str(r.charged), r.reason, r.owed_at.isoformat(timespec="seconds"),
            refunded,
        )  # fmt: skip
    console.print(table)


def refund_json(refund: RefundRecord) -> dict[str, object]:
    return {
        "item_id": refund.item_id, "payment_id": refund.payment_id,
        "order_id": str(refund.order_id), "buyer": refund.buyer, "quantity": refund.quantity,
        "amount_cents": refund.amount_cents, "currency": refund.currency,
        "reason": refund.reason, "state": refund.state,
        "owed_at": refund.owed_at.isoformat(),
        "refunded_at": refund.refunded_at.isoformat() if refund.refunded_at else None,
    }  # fmt: skip
