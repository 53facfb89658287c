"""Buyer routes: see an item, buy it, see and cancel one's own orders.

The item read and the purchase are lean routes (``GET_ITEM``, ``BUY``: see
``seckill.api.lean_routes``), served ahead of the framework; the orders are the framework's.
"""

from __future__ import annotations

import functools
import time
from typing import Annotated

from fastapi import APIRouter, Depends, Path

from seckill.api.auth import BuyerIdentity
from seckill.api.bodies import parse_body
from seckill.api.context import context
from seckill.api.errors import ApiError, documented, refusal
from seckill.api.lean_routes import REFUSED, Answer, HeaderParam, LeanRoute, Request, header_text
from seckill.api.paths import ITEM_ROUTE, PURCHASE_ROUTE, ItemId
from seckill.api.schemas import BuyIn, ItemOut, OrderId, OrderOut, ReservationOut
from seckill.api.tickets import TICKET_PARAM
from seckill.bootstrap.services import Context
from seckill.domain.orders import OrderStatus
from seckill.domain.outcomes import ApiRefusal, Outcome
from seckill.domain.times import ms_to_datetime
from seckill.security.tokens import Role
from seckill.services.items import ItemOnSale, item_on_sale
from seckill.services.orders import OrderView

router = APIRouter(prefix="/api/v1", tags=["buyers"])
Ctx = Annotated[Context, Depends(context)]
OrderIdPath = Annotated[OrderId, Path()]


async def get_item(ctx: Context, request: Request) -> Answer:
    """What a buyer sees: name, price, sale window and units left (the item from a cache in
    front of SQL; the units left read live, except that once a purchase in this process heard
    the item is sold out they show 0 for up to SECKILL_SOLD_OUT_RECHECK_MS, unread)."""
    seen = await item_on_sale(
        ctx.item_cache, request.item_id, ledger=ctx.ledger, sold_out=ctx.sold_out
    )
    return Answer(200, item_out(seen).model_dump_json().encode(), "200", [])


GET_ITEM = LeanRoute(
    method="GET",
    template=ITEM_ROUTE,
    decide=get_item,
    answer=ItemOut,
    errors=documented(404, 422, 503),
)


def item_out(seen: ItemOnSale) -> ItemOut:
    """The item as buyers see it (and the admin routes show it)."""
    r = seen.record
    return ItemOut(
        item_id=r.item_id, name=r.name, price_cents=r.price_cents, currency=r.currency,
        total=r.total,
        starts_at=r.starts_at, ends_at=r.ends_at, per_buyer_limit=r.per_buyer_limit,
        hold_seconds=r.hold_seconds, stock_shards=r.stock_shards, waiting_room=r.waiting_room,
        queue_admit_per_second=r.queue_admit_per_second,
        queue_open_seconds=r.queue_open_seconds, available=seen.available,
    )  # fmt: skip


IDEMPOTENCY_KEY_PARAM = HeaderParam(
    name="Idempotency-Key",
    required=True,
    description="One purchase per key and buyer; a repeat gets the same answer. "
    "Without it: 400 idempotency_key_required.",
)
_KEY = IDEMPOTENCY_KEY_PARAM.key
_TICKET = TICKET_PARAM.key
_NO_BODY = BuyIn()
# Purchase bodies read before, by (body, content type): reading one is a pure function of the
# two, and a crowd sends a handful of distinct ones. Bounded: past it, each is read anew.
_BODIES_READ: dict[tuple[bytes, bytes | None], BuyIn] = {}
_REMEMBERED_BODIES = 256
_REMEMBERED_BODY_BYTES = 64


async def buy(ctx: Context, request: Request) -> Answer:
    """Hold units for the buyer: 202 with the order and the time to pay before.

    Needs a ticket for this buyer and item (``Seckill-Ticket``; 403 ``invalid_ticket``
    without), checked before anything touches stock. 503 ``overloaded`` with ``Retry-After``
    when this process already decides as many purchases as it may at once."""
    # After the caller: the body (415, 422), the Idempotency-Key (400 without one), the ticket
    # (403), then Purchases.buy, one Redis round trip (the sold-out flag before it).
    headers, item_id, buyer = request.headers, request.item_id, request.caller
    quantity = _quantity(request.body, headers.get(b"content-type")).quantity
    key = idempotency_key(header_text(headers.get(_KEY)))
    ctx.tickets.check(header_text(headers.get(_TICKET)), item_id=item_id, buyer=buyer)
    reservation = await ctx.purchases.buy(
        item_id,
        buyer=buyer,
        quantity=quantity,
        idempotency_key=key,
        request_id=request.request_id,
    )
    if not reservation.accepted:
        if reservation.retry_after_ms is None:
            return REFUSED[reservation.outcome]
        return Answer.error(refusal(reservation))  # with its Retry-After
    assert reservation.order_id is not None and reservation.deadline_ms is not None
    held = held_body(reservation.order_id, item_id, quantity, reservation.deadline_ms)
    return Answer(202, held, "reserved", [])


BUY = LeanRoute(
    method="POST",
    template=PURCHASE_ROUTE,
    decide=buy,
    caller=Role.BUYER,
    admitted=True,
    body=BuyIn,
    headers=(IDEMPOTENCY_KEY_PARAM, TICKET_PARAM),
    status=202,
    answer=ReservationOut,
    # 409 request_in_flight (the same key's first request is still being decided) says when
    # to ask again; a sold-out 409 does not.
    errors=documented(400, 401, 403, 404, 409, 413, 415, 422, 429, 503, retry_after=(409,)),
)


def _quantity(body: bytes, content_type: bytes | None) -> BuyIn:
    """The body as ``BuyIn``: none at all buys one unit; one sent is read as every body is,
    once: a crowd sends the same few bodies, so what a short one said is remembered."""
    if not body:
        return _NO_BODY
    key = (body, content_type)
    read = _BODIES_READ.get(key)
    if read is None:
        read = parse_body(BuyIn, body, content_type)  # a refused body raises: never remembered
        if len(body) <= _REMEMBERED_BODY_BYTES and len(_BODIES_READ) < _REMEMBERED_BODIES:
            _BODIES_READ[key] = read
    return read


def held_body(order_id: int, item_id: int, quantity: int, deadline_ms: int) -> bytes:
    """The 202's body, byte for byte what ``ReservationOut`` writes (tests/unit/test_lean_routes.py
    holds them equal): formatted here because the model costs a purchase 6 µs, this 2."""
    seconds, ms = divmod(deadline_ms, 1000)
    when = _second(seconds)
    fraction = f".{ms:03d}000" if ms else ""  # pydantic writes microseconds, or none
    return (
        f'{{"order_id":"{order_id}","item_id":{item_id},"quantity":{quantity},'
        f'"status":"{OrderStatus.HELD.value}","pay_before":"{when}{fraction}Z"}}'
    ).encode()


@functools.lru_cache(maxsize=4)  # a burst's deadlines fall in the same few seconds
def _second(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


def idempotency_key(header: str | None) -> str:
    """The key of an ``Idempotency-Key`` header; 400 ``idempotency_key_required`` without one."""
    if header is None:
        raise ApiError(400, ApiRefusal.IDEMPOTENCY_KEY_REQUIRED, "send an Idempotency-Key header")
    # The draft's value is a structured-field string ("..."); a bare token is accepted too.
    key = header.strip()
    if len(key) >= 2 and key[0] == key[-1] == '"':
        key = key[1:-1]
    return key


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
