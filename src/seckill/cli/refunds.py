"""``seckill refunds``: the refunds owed (successful charges that paid nothing), listed and
marked given back."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer

from seckill.cli.common import (
    abort,
    console,
    with_runtime,
)

if TYPE_CHECKING:
    from seckill.bootstrap.runtime import Runtime

commands = typer.Typer(
    help="Refunds owed: successful charges that paid nothing.", no_args_is_help=True
)


@commands.command("list")
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


@commands.command("mark")
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
