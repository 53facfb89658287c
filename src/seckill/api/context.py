"""What the routes work with: the services, wired once per app from a Runtime."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from seckill.bootstrap import Runtime
from seckill.engine.queues import Queues
from seckill.security.passes import PassCodec
from seckill.security.signatures import payment_secret
from seckill.security.tickets import TicketCodec, ticket_secret
from seckill.security.tokens import TokenCodec, token_codec
from seckill.services.item_cache import ItemCache
from seckill.services.orders import OrderBook
from seckill.services.purchases import Purchases
from seckill.services.tickets import TicketGate, TicketOffice
from seckill.services.waiting_room import WaitingRoom
from seckill.store.ledger import Ledger


@dataclass(frozen=True, slots=True, kw_only=True)
class Context:
    runtime: Runtime
    ledger: Ledger  # the request ledger: SQL that does not answer in time is a 503
    purchases: Purchases
    orders: OrderBook
    item_cache: ItemCache
    tokens: TokenCodec
    payment_secret: bytes
    tickets: TicketOffice
    waiting_room: WaitingRoom | None  # with SECKILL_WAITING_ROOM

    @classmethod
    def build(cls, runtime: Runtime, *, ticket_gate: TicketGate | None = None) -> Context:
        """``ticket_gate`` stands in front of ticket issuance (a captcha); without one, the
        waiting room does when the settings ask for it, else everyone is admitted."""
        settings = runtime.settings
        secret = ticket_secret(settings)
        waiting_room = None
        if settings.waiting_room:
            waiting_room = WaitingRoom(
                queues=Queues(runtime.engine),
                codec=PassCodec(secret),
                open_lead_ms=settings.queue_open_seconds * 1000,
                front_ttl_ms=int(settings.queue_front_seconds * 1000),
            )
        return cls(
            runtime=runtime,
            ledger=runtime.request_ledger,
            purchases=Purchases(
                runtime.engine,
                runtime.order_ids,
                sold_out_recheck_ms=settings.sold_out_recheck_ms,
            ),
            orders=OrderBook(engine=runtime.engine, ledger=runtime.request_ledger),
            item_cache=ItemCache.from_settings(
                settings, engine=runtime.engine, source=runtime.request_ledger
            ),
            tokens=token_codec(settings),
            payment_secret=payment_secret(settings),
            tickets=TicketOffice(
                engine=runtime.engine,
                codec=TicketCodec(secret),
                gate=ticket_gate or waiting_room,
                ttl_ms=settings.ticket_ttl_seconds * 1000,
                lead_ms=settings.ticket_lead_seconds * 1000,
            ),
            waiting_room=waiting_room,
        )


# Dependencies are async on purpose: FastAPI runs a plain ``def`` dependency in its thread pool,
# a hop per dependency per request that cost the purchase route about a third of its rate.
async def context(request: Request) -> Context:
    ctx: Context = request.app.state.context
    return ctx
