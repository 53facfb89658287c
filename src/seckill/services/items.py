"""Items: created in SQL (the record), warmed into Redis (where they are sold), and read back."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from seckill.domain.items import ItemRecord, NewItem, Stock
from seckill.domain.outcomes import ErrorCode, InvalidRequest, Outcome
from seckill.engine.engine import RedisEngine
from seckill.engine.streams import backlog
from seckill.services.item_cache import ItemCache
from seckill.services.sold_out import SoldOutFlags
from seckill.store.ledger import Ledger


class UnknownItem(LookupError):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class ItemDefaults:
    """What an item created without them gets: the deployment's settings (SECKILL_PER_BUYER_LIMIT,
    SECKILL_HOLD_SECONDS, SECKILL_STOCK_SHARDS, SECKILL_WAITING_ROOM, SECKILL_CURRENCY)."""

    per_buyer_limit: int
    hold_seconds: int
    stock_shards: int
    waiting_room: bool
    currency: str


async def create_item(
    ledger: Ledger,
    cache: ItemCache,
    defaults: ItemDefaults,
    *,
    name: str,
    price_cents: int,
    total: int,
    starts_at: datetime,
    ends_at: datetime,
    per_buyer_limit: int | None = None,
    hold_seconds: int | None = None,
    stock_shards: int | None = None,
    waiting_room: bool | None = None,
    queue_admit_per_second: int | None = None,
    queue_open_seconds: int | None = None,
    currency: str | None = None,
) -> int:
    """Put an item in the record (SQL) and write its card; it goes on sale once warmed.

    A per-buyer limit, hold time, stock shard count, waiting room or currency left out is the
    ``defaults``'. A room's pace and opening lead left out stay unset: the deployment's at the
    time it sells (SECKILL_QUEUE_ADMIT_PER_SECOND, SECKILL_QUEUE_OPEN_SECONDS). Returns the new
    item's id.
    """
    item_id = await ledger.create_item(
        NewItem(
            name=name,
            price_cents=price_cents,
            currency=defaults.currency if currency is None else currency,
            total=total,
            starts_at=starts_at,
            ends_at=ends_at,
            per_buyer_limit=(
                defaults.per_buyer_limit if per_buyer_limit is None else per_buyer_limit
            ),
            hold_seconds=defaults.hold_seconds if hold_seconds is None else hold_seconds,
            stock_shards=defaults.stock_shards if stock_shards is None else stock_shards,
            waiting_room=defaults.waiting_room if waiting_room is None else waiting_room,
            queue_admit_per_second=queue_admit_per_second,
            queue_open_seconds=queue_open_seconds,
        )
    )
    # Its card is written now: the id may have been cached as absent a moment ago.
    await cache.refresh(item_id)
    return item_id


async def warm_item(
    engine: RedisEngine,
    ledger: Ledger,
    item_id: int,
    *,
    force: bool = False,
    cache: ItemCache | None = None,
) -> Outcome:
    """Load the item as SQL records it into Redis. An item with holds or sales in Redis is
    refused (``item_active``) unless forced, and even then keeps them (see load_item.lua).
    With ``cache``, the item's card is rewritten from SQL too."""
    record = await ledger.item(item_id)
    if record is None:
        raise UnknownItem(f"item {item_id} is not in the database")
    outcome = await _load(engine, ledger, record, force=force)
    if cache is not None:
        await cache.refresh(item_id)
    return outcome


async def end_sale(
    engine: RedisEngine,
    ledger: Ledger,
    item_id: int,
    *,
    cache: ItemCache | None = None,
    now: datetime | None = None,
) -> None:
    """End the item's sale at ``now``: the reserve script takes nothing after it, while holds
    taken before may still be paid until their deadline. SQL is written first and Redis follows
    (the item reloaded with its holds and sales kept), so ending again finishes an end that
    stopped halfway. Refused, with nothing changed, for a sale not yet begun or an item archived.
    With ``cache``, the item's card is rewritten too (other processes' within their TTL; the
    script decides either way)."""
    record = await ledger.item(item_id)
    if record is None:
        raise UnknownItem(f"item {item_id} is not in the database")
    now = now or datetime.now(UTC)
    if record.starts_at >= now:
        raise InvalidRequest(
            ErrorCode.SALE_NOT_STARTED,
            f"item {item_id}'s sale starts at {record.starts_at}: there is no sale to end yet",
        )
    if await ledger.archived_at(item_id) is not None:
        raise InvalidRequest(ErrorCode.ITEM_ARCHIVED, f"item {item_id} is archived: its sale ended")
    await ledger.end_sale(item_id, now)
    if await engine.item(item_id) is not None:  # an item never warmed has nothing to end there
        ended = await ledger.item(item_id)
        assert ended is not None  # items are never deleted
        await _load(engine, ledger, ended, force=True)
    if cache is not None:
        await cache.refresh(item_id)


async def _load(engine: RedisEngine, ledger: Ledger, record: ItemRecord, *, force: bool) -> Outcome:
    """Load an item, unless Redis lost a sale SQL records (held or sold units): loading it would
    put every unit on sale again. That item needs ``seckill recover``, which keeps them."""
    if await ledger.archived_at(record.item_id) is not None:
        raise InvalidRequest(
            ErrorCode.ITEM_ARCHIVED,
            f"item {record.item_id} is archived: its sale is over and SQL is its record",
        )
    stock = await ledger.stock(record.item_id)
    if (
        stock is not None
        and (stock.held or stock.sold)
        and await engine.item(record.item_id) is None
    ):
        raise InvalidRequest(
            ErrorCode.ITEM_ACTIVE,
            f"SQL records {stock.held} held and {stock.sold} sold but Redis has no such sale "
            f"(it lost its data): run `seckill recover {record.item_id}`",
        )
    return await engine.load_item(record.sale_item(), force=force)


@dataclass(frozen=True, slots=True)
class WarmedItem:
    """One item of a bulk warm-up: what the engine answered, and how long its card lives."""

    record: ItemRecord
    outcome: Outcome | ErrorCode  # item_active: on sale already, with holds or sales; kept
    card_ttl_ms: int | None  # -1: no expiry


async def warm_items(
    engine: RedisEngine, ledger: Ledger, cache: ItemCache, *, now: datetime, force: bool = False
) -> list[WarmedItem]:
    """Warm every item whose sale has not ended at ``now`` (engine and card), in start order.

    An item the engine refuses (``item_active`` without ``force``) still gets its card: the card
    is what SQL says, which is what a reader would load anyway.
    """
    warmed = []
    for record in await ledger.items_on_sale(now):
        outcome: Outcome | ErrorCode
        try:
            outcome = await _load(engine, ledger, record, force=force)
        except InvalidRequest as refused:
            outcome = refused.code
        await cache.refresh(record.item_id)
        warmed.append(WarmedItem(record, outcome, await cache.card_ttl_ms(record.item_id)))
    return warmed


@dataclass(frozen=True, slots=True)
class ItemOnSale:
    """What a buyer sees: the record, and what is left right now (None until warmed)."""

    record: ItemRecord
    available: int | None


async def item_on_sale(
    cache: ItemCache,
    item_id: int,
    *,
    ledger: Ledger | None = None,
    sold_out: SoldOutFlags | None = None,
) -> ItemOnSale:
    """The item through the cache, with ``available`` read live; UnknownItem if SQL has no such
    id. With ``ledger``, an item Redis does not hold whose sale has ended (archived) shows what
    SQL says was left. With ``sold_out`` (a buyer's read), ``available`` is 0 with no read of
    the counters while this process's sold-out flag stands for the item (as stale as the flag
    may be: ``seckill.services.sold_out``)."""
    record = await cache.record(item_id)
    if record is None:
        raise UnknownItem(f"no item {item_id}")
    if sold_out is not None and sold_out.answers(item_id, "item"):
        return ItemOnSale(record, 0)
    available = await cache.available(item_id)
    if available is None and ledger is not None and record.ends_at <= datetime.now(UTC):
        stock = await ledger.stock(item_id)
        available = None if stock is None else stock.available
    return ItemOnSale(record, available)


@dataclass(frozen=True, slots=True)
class ItemCounters:
    """An item's counters in Redis and in SQL, side by side (None where it is absent).

    SQL trails Redis by the stream's backlog, so the two agree once the backlog has landed.
    """

    item_id: int
    redis: Stock | None
    sql: Stock | None
    backlog: int  # stream entries not yet acknowledged by the persister
    shards: list[Stock | None]  # each stock shard's own counters in Redis (one: the item's)


async def require_item(engine: RedisEngine, ledger: Ledger, item_id: int) -> None:
    """``UnknownItem`` unless SQL or Redis has the item's counters (an admin look at it)."""
    if await ledger.stock(item_id) is None and await engine.stock(item_id) is None:
        raise UnknownItem(f"no item {item_id}")


async def item_counters(engine: RedisEngine, ledger: Ledger, item_id: int) -> ItemCounters:
    sql = await ledger.stock(item_id)
    redis = await engine.stock(item_id)
    if sql is None and redis is None:
        raise UnknownItem(f"no item {item_id}")
    shards = [
        None if part is None else part[0]
        for part in [
            await engine.shard_stock(item_id, shard)
            for shard in range(await engine.shard_count(item_id))
        ]
    ]
    return ItemCounters(item_id, redis, sql, await backlog(engine, item_id), shards)
