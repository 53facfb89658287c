"""What the API's routes and the commands work with: the services, wired from a Runtime."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from seckill.bootstrap.keys import payment_secret, ticket_secret, token_codec
from seckill.bootstrap.runtime import Runtime
from seckill.config import Settings
from seckill.engine.queues import Queues
from seckill.security.passes import PassCodec
from seckill.security.tickets import TicketCodec
from seckill.security.tokens import TokenCodec
from seckill.services.archive import Archivist
from seckill.services.item_cache import ItemCache, ItemSource
from seckill.services.items import ItemDefaults
from seckill.services.orders import OrderBook
from seckill.services.purchases import Purchases
from seckill.services.reconcile.reconciler import Reconciler
from seckill.services.sold_out import SoldOutFlags
from seckill.services.tickets import TicketGate, TicketOffice
from seckill.services.waiting_room import WaitingRoom
from seckill.sinks import Sink, sink_from_url
from seckill.store.ledger import Ledger


@dataclass(frozen=True, slots=True, kw_only=True)
class Context:
    """What the routes work with, built once per app (``build_context``): ready objects and
    values, so that no route reads a setting."""

    runtime: Runtime
    ledger: Ledger  # the request ledger: SQL that does not answer in time is a 503
    purchases: Purchases
    sold_out: SoldOutFlags  # this process's sold-out flags: purchases, tickets and item reads
    orders: OrderBook
    item_cache: ItemCache
    tokens: TokenCodec
    payment_secret: tuple[bytes, ...]  # the keys notices are checked with
    payment_tolerance_seconds: int  # how far a notice's signed time may be from now
    tickets: TicketOffice
    queues: Queues
    waiting_room: WaitingRoom  # the queues of the items created with one
    item_defaults: ItemDefaults  # what an item created without them gets
    # The bridge's broker, for replaying its dead letters (None: the deployment has none).
    bridge_sink: Callable[[], Sink | None]


def build_context(runtime: Runtime, *, ticket_gate: TicketGate | None = None) -> Context:
    """``ticket_gate`` stands in front of ticket issuance (a captcha; default: everyone is
    admitted); an item with a waiting room has the room in front of it as well."""
    settings = runtime.settings
    secret = ticket_secret(settings)
    queues = Queues(runtime.engine)
    waiting_room = WaitingRoom(
        queues=queues,
        codec=PassCodec(secret),
        open_lead_ms=settings.queue_open_seconds * 1000,
        front_ttl_ms=int(settings.queue_front_seconds * 1000),
    )
    # One flag per item for the whole process: what a purchase heard from Redis answers the
    # tickets and item reads that follow it too.
    sold_out = SoldOutFlags(settings.sold_out_recheck_ms)
    return Context(
        runtime=runtime,
        ledger=runtime.request_ledger,
        purchases=Purchases(runtime.engine, runtime.order_ids, sold_out=sold_out),
        sold_out=sold_out,
        orders=OrderBook(
            engine=runtime.engine,
            ledger=runtime.request_ledger,
            landing_timeout_s=settings.payment_landing_timeout_seconds,
        ),
        item_cache=item_cache(runtime, source=runtime.request_ledger),
        tokens=token_codec(settings),
        payment_secret=payment_secret(settings),
        payment_tolerance_seconds=settings.payment_tolerance_seconds,
        tickets=TicketOffice(
            engine=runtime.engine,
            codec=TicketCodec(secret),
            gate=ticket_gate,
            waiting_room=waiting_room,
            sold_out=sold_out,
            ttl_ms=settings.ticket_ttl_seconds * 1000,
            lead_ms=settings.ticket_lead_seconds * 1000,
        ),
        queues=queues,
        waiting_room=waiting_room,
        item_defaults=item_defaults(settings),
        bridge_sink=lambda: sink_from_url(settings.bridge_url) if settings.bridge_url else None,
    )


def item_defaults(settings: Settings) -> ItemDefaults:
    """What an item created without them gets, from the settings."""
    return ItemDefaults(
        per_buyer_limit=settings.per_buyer_limit,
        hold_seconds=settings.hold_seconds,
        stock_shards=settings.stock_shards,
        waiting_room=settings.waiting_room,
        currency=settings.currency,
    )


def item_cache(runtime: Runtime, *, source: ItemSource) -> ItemCache:
    """Items as buyers see them, read from ``source`` (the API's bounded ledger, or a
    command's)."""
    settings = runtime.settings
    return ItemCache(
        engine=runtime.engine,
        source=source,
        local_seconds=settings.item_cache_local_seconds,
        redis_seconds=settings.item_cache_redis_seconds,
        jitter_seconds=settings.item_cache_jitter_seconds,
        absent_seconds=settings.item_absent_seconds,
        # Cards stop expiring one TTL before the sale: the crowd arrives before the start.
        sale_lead_seconds=settings.item_cache_redis_seconds,
    )


def archivist(runtime: Runtime, *, ledger: Ledger | None = None) -> Archivist:
    """Archiving, on ``ledger`` (default: the runtime's own)."""
    grace = timedelta(seconds=runtime.settings.archive_grace_seconds)
    return Archivist(engine=runtime.engine, ledger=ledger or runtime.ledger, grace=grace)


def reconciler(runtime: Runtime, *, ledger: Ledger | None = None) -> Reconciler:
    """Reconciling, on ``ledger`` (default: the runtime's own), with the configured grace."""
    grace_ms = int(runtime.settings.reconcile_grace_seconds * 1000)
    return Reconciler(runtime.engine, ledger or runtime.ledger, grace_ms=grace_ms)
