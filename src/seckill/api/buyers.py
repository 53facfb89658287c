"""Buyer routes: see an item, buy it, see and cancel one's own orders."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Header, Path

from seckill.api.auth import BuyerIdentity
from seckill.api.context import context
from seckill.api.errors import documented, refusal
from seckill.api.paths import ITEM_ROUTE, PURCHASE_ROUTE, ItemId
from seckill.api.schemas import BuyIn, ItemOut, OrderId, OrderOut, ReservationOut
from seckill.api.tickets import TicketHeader
from seckill.bootstrap.services import Context
from seckill.domain.outcomes import Outcome
from seckill.domain.times import ms_to_datetime
from seckill.services.items import ItemOnSale, item_on_sale
from seckill.services.orders import OrderView

router = APIRouter(prefix="/api/v1", tags=["buyers"])
Ctx = Annotated[Context, Depends(context)]
OrderIdPath = Annotated[OrderId, Path()]


@router.get(
    ITEM_ROUTE.removeprefix(router.prefix),
    response_model=ItemOut,
    responses=documented(404, 422, 503),
)
async def get_item(item_id: ItemId, ctx: Ctx) -> ItemOut:
    """What a buyer sees: name, price, sale window and units left (the item from a cache in
    front of SQL; the units left read live, except that once a purchase in this process heard
    the item is sold out they show 0 for up to SECKILL_SOLD_OUT_RECHECK_MS, unread)."""
    # GET is served by seckill.api.lean_routes, ahead of the framework; HEAD comes here.
    seen = await item_on_sale(ctx.item_cache, item_id, ledger=ctx.ledger, sold_out=ctx.sold_out)
    return item_out(seen)


def item_out(seen: ItemOnSale) -> ItemOut:
    r = seen.record
    return ItemOut(
        item_id=r.item_id, name=r.name, price_cents=r.price_cents, currency=r.currency,
        total=r.total,
        starts_at=r.starts_at, ends_at=r.ends_at, per_buyer_limit=r.per_buyer_limit,
        hold_seconds=r.hold_seconds, stock_shards=r.stock_shards, waiting_room=r.waiting_room,
        queue_admit_per_second=r.queue_admit_per_second,
        queue_open_seconds=r.queue_open_seconds, available=seen.available,
    )  # fmt: skip


@router.post(
    PURCHASE_ROUTE.removeprefix(router.prefix),
    status_code=202,
    response_model=ReservationOut,
    # 409 request_in_flight (the same key's first request is still being decided) says when
    # to ask again; a sold-out 409 does not.
    responses=documented(400, 401, 403, 404, 409, 413, 415, 422, 429, 503, retry_after=(409,)),
)
async def buy(
    item_id: ItemId,
    buyer: BuyerIdentity,
    idempotency_key: Annotated[
        str,
        Header(
            alias="Idempotency-Key",
            description="One purchase per key and buyer; a repeat gets the same answer. "
            "Without it: 400 idempotency_key_required.",
        ),
    ],
    ticket: TicketHeader = None,
    body: Annotated[BuyIn | None, Body()] = None,
) -> ReservationOut:
    """Hold units for the buyer: 202 with the order and the time to pay before.

    Needs a ticket for this buyer and item (``Seckill-Ticket``; 403 ``invalid_ticket``
    without), checked before anything touches stock. 503 ``overloaded`` with ``Retry-After``
    when this process already decides as many purchases as it may at once."""
    # The schema's entry only: every purchase is served by seckill.api.lean_routes, ahead of
    # the framework, and the schema tests hold its answers to what is declared here.
    raise NotImplementedError("purchases are served by seckill.api.lean_routes")


# An order is addressed under the item whose purchase made it: its hold lives in that item's
# keys (one slot), so it is found in one read, and order ids (snowflakes) have no room for it.
ORDER_ROUTE = f"{PURCHASE_ROUTE}/{{order_id}}".removeprefix(router.prefix)


@router.get(
    ORDER_ROUTE, response_model=OrderOut, responses=documented(401, 403, 404, 410, 422, 503)
)
async def get_order(
    item_id: ItemId, order_id: OrderIdPath, buyer: BuyerIdentity, ctx: Ctx
) -> OrderOut:
    """The buyer's own order, whether it is still only in Redis or already in SQL. 410
    ``order_lost`` for one answered 202 that Redis lost before SQL had it (``fast``
    durability): its units are back on sale, and the buyer may buy again."""
    return order_out(await ctx.orders.buyers_order(buyer.subject, item_id, int(order_id)))


@router.post(
    f"{ORDER_ROUTE}/cancel",
    response_model=OrderOut,
    responses=documented(401, 403, 404, 409, 410, 422, 503),
)
async def cancel_order(
    item_id: ItemId, order_id: OrderIdPath, buyer: BuyerIdentity, ctx: Ctx
) -> OrderOut:
    """Give the hold back; the units go on sale again. Repeating it changes nothing. 410
    ``order_lost`` for an order Redis lost before SQL had it: there is nothing to give back."""
    transition, view = await ctx.orders.cancel(buyer.subject, item_id, int(order_id))
    if transition.outcome is Outcome.ALREADY_PAID:
        raise refusal(Outcome.ALREADY_PAID)
    return order_out(view)


def order_out(view: OrderView) -> OrderOut:
    return OrderOut.model_validate(
        {
            "order_id": str(view.order_id),
            "item_id": view.item_id,
            "quantity": view.quantity,
            "status": view.status,
            "release_reason": view.release_reason,
            "pay_before": ms_to_datetime(view.pay_before_ms) if view.pay_before_ms else None,
        }
    )
