"""SQL tables (SQLAlchemy 2). One schema for SQLite, MariaDB/MySQL and PostgreSQL.

Times are stored as UTC without a zone (MariaDB's DATETIME has none) and read back as aware UTC.
Money is whole cents. Counts are BIGINT: a total can be large, an order id is 64-bit.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Dialect,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from seckill.domain.orders import OrderStatus

# An autoincrement BIGINT that SQLite accepts as its rowid alias.
BigId = BigInteger().with_variant(Integer, "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC in Python, naive UTC in the database."""

    impl = DateTime(timezone=False).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | str | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: pass an aware UTC time")
        utc = value.astimezone(UTC).replace(tzinfo=None)
        if dialect.name in {"mysql", "mariadb"}:
            # asyncmy formats datetimes ~10x slower than strings; the text is what it would send.
            return utc.isoformat(" ", timespec="microseconds")
        return utc

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(table_name)s_%(column_0_N_name)s",
            "uq": "uq_%(table_name)s_%(column_0_N_name)s",
            "ck": "ck_%(table_name)s_%(constraint_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


class Item(Base):
    __tablename__ = "items"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200))
    price_cents: Mapped[int] = mapped_column(BigInteger)  # of one unit, in ``currency``
    currency: Mapped[str] = mapped_column(String(3))  # ISO 4217
    total: Mapped[int] = mapped_column(BigInteger)
    starts_at: Mapped[datetime] = mapped_column(UTCDateTime)
    ends_at: Mapped[datetime] = mapped_column(UTCDateTime)
    per_buyer_limit: Mapped[int] = mapped_column(Integer)
    hold_seconds: Mapped[int] = mapped_column(Integer)
    stock_shards: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    waiting_room: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    queue_admit_per_second: Mapped[int | None] = mapped_column(Integer)  # None: the deployment's
    queue_open_seconds: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # Set once its Redis keys are removed (or being removed): SQL answers every read from then on.
    archived_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (
        CheckConstraint("stock_shards >= 1 AND stock_shards <= 64", name="stock_shards"),
        CheckConstraint("price_cents >= 0", name="price"),
        CheckConstraint("total >= 0", name="total"),
        CheckConstraint("per_buyer_limit >= 1", name="per_buyer_limit"),
        CheckConstraint("hold_seconds >= 1", name="hold_seconds"),
        CheckConstraint("starts_at < ends_at", name="window"),
    )


class Inventory(Base):
    """Stock counters per item, moved only by landed events."""

    __tablename__ = "inventory"

    item_id: Mapped[int] = mapped_column(ForeignKey("items.id"), primary_key=True)
    total: Mapped[int] = mapped_column(BigInteger)
    available: Mapped[int] = mapped_column(BigInteger)
    held: Mapped[int] = mapped_column(BigInteger, default=0)
    sold: Mapped[int] = mapped_column(BigInteger, default=0)
    version: Mapped[int] = mapped_column(BigInteger, default=0)
    # The newest `loaded` event applied ("ms-seq", zero-padded so strings sort as positions).
    loaded_position: Mapped[str] = mapped_column(String(41), default="")

    __table_args__ = (
        CheckConstraint("available >= 0", name="available"),
        CheckConstraint("held >= 0", name="held"),
        CheckConstraint("sold >= 0", name="sold"),
        CheckConstraint("available + held + sold = total", name="balanced"),
    )


class Order(Base):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    item_id: Mapped[int] = mapped_column(ForeignKey("items.id"))
    buyer: Mapped[str] = mapped_column(String(64))
    quantity: Mapped[int] = mapped_column(Integer)
    price_cents: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16))
    release_reason: Mapped[str | None] = mapped_column(String(16))
    deadline_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    request_id: Mapped[str | None] = mapped_column(String(64))  # the API request that reserved it
    # The buyer's idempotency key for the purchase: a Redis rebuilt from SQL gets it back.
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    payment_id: Mapped[str | None] = mapped_column(String(64))  # the payment that paid it
    reserved_at: Mapped[datetime] = mapped_column(UTCDateTime)
    paid_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    released_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (
        CheckConstraint("quantity >= 1", name="quantity"),
        CheckConstraint(
            "status IN (" + ", ".join(f"'{s}'" for s in OrderStatus) + ")", name="status"
        ),
        Index(None, "item_id", "status"),
        Index(None, "item_id", "buyer"),
        # A payment id names one payment of its item: it pays one order at most.
        UniqueConstraint("item_id", "payment_id"),
        Index(None, "payment_id"),  # looked up across items (the reconciler)
    )


class StockFlow(Base):
    """The journal: one row per stream event, with the counter moves it caused. An event is
    named by its item, the stock shard whose stream carried it (0 for an unsharded item) and its
    entry id there."""

    __tablename__ = "stock_flow"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    item_id: Mapped[int] = mapped_column(BigInteger)
    shard: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    event_id: Mapped[str] = mapped_column(String(41))
    event: Mapped[str] = mapped_column(String(16))
    order_id: Mapped[int | None] = mapped_column(BigInteger)
    quantity: Mapped[int | None] = mapped_column(Integer)
    reason: Mapped[str | None] = mapped_column(String(32))
    transfer_id: Mapped[str | None] = mapped_column(String(64))  # transferred_out / _in only
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    available_delta: Mapped[int] = mapped_column(BigInteger)
    held_delta: Mapped[int] = mapped_column(BigInteger)
    sold_delta: Mapped[int] = mapped_column(BigInteger)

    __table_args__ = (
        UniqueConstraint("item_id", "shard", "event_id"),
        Index(None, "order_id"),
    )


class DeadLetter(Base):
    """A stream entry the persister could not land after its deliveries, with why, and what a
    person did with it since (replayed: landed; dropped: decided not to land it)."""

    __tablename__ = "dead_letters"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    stream: Mapped[str] = mapped_column(String(200))
    entry_id: Mapped[str] = mapped_column(String(41))
    payload: Mapped[str] = mapped_column(Text)
    error: Mapped[str] = mapped_column(Text)
    deliveries: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    replayed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    dropped_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (UniqueConstraint("stream", "entry_id"),)


class Payment(Base):
    """A payment provider's notice about an archived item's order, and the answer it got: the
    notices Redis recorded, moved here when the item was archived, and the ones that came later
    (so a provider retrying is answered as it was, for as long as it retries). A payment id
    names one payment of its item, as in Redis."""

    __tablename__ = "payments"

    item_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    payment_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    order_id: Mapped[int] = mapped_column(BigInteger)
    succeeded: Mapped[bool] = mapped_column(Boolean)
    outcome: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str | None] = mapped_column(String(32))
    # The charge the notice carried (None: recorded before notices carried one).
    amount_cents: Mapped[int | None] = mapped_column(BigInteger)
    currency: Mapped[str | None] = mapped_column(String(3))
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (Index(None, "order_id"), Index(None, "payment_id"))


class Refund(Base):
    """A refund owed: a successful charge that paid nothing (its order was released first,
    another payment had paid it, it was not the order's sum, or nobody knows its order), one
    per payment, of the sum charged, landed from its `refund_required` event (``shard``,
    ``event_id``). An operator gives the money back and marks it refunded."""

    __tablename__ = "refunds"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    item_id: Mapped[int] = mapped_column(BigInteger)
    payment_id: Mapped[str] = mapped_column(String(64))
    order_id: Mapped[int] = mapped_column(BigInteger)  # as the notice named it
    buyer: Mapped[str | None] = mapped_column(String(64))  # None: an unknown order's
    quantity: Mapped[int | None] = mapped_column(Integer)
    amount_cents: Mapped[int] = mapped_column(BigInteger)  # the sum charged
    currency: Mapped[str] = mapped_column(String(3))
    reason: Mapped[str] = mapped_column(String(32))
    shard: Mapped[int] = mapped_column(Integer)
    event_id: Mapped[str] = mapped_column(String(41))
    owed_at: Mapped[datetime] = mapped_column(UTCDateTime)
    refunded_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (
        UniqueConstraint("item_id", "payment_id"),
        Index(None, "order_id"),
        Index(None, "refunded_at", "id"),
        Index(None, "payment_id"),
    )


class Repair(Base):
    """The reconciler's journal: every repair it made, with the drift it found."""

    __tablename__ = "repairs"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    item_id: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(32))
    subject: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(Text)
    detail: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (Index(None, "item_id"),)


class StreamGroup(Base):
    """A consumer group that follows every item stream (a bridge's, ``bridge-<sink>``), as its
    readers registered it: the durable copy of Redis's registry (``engine/group_registry.py``),
    which recovery puts back before it gives a stream its events again. The persister's group
    is always registered and is not listed here."""

    __tablename__ = "stream_groups"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    registered_at: Mapped[datetime] = mapped_column(UTCDateTime)
