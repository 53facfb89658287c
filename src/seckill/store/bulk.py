"""Bulk statements: the one place that knows a driver.

A batch (``store/landing.py``) names a thousand orders at once and inserts as many rows in each
table, inside its transaction. ``bulk_for`` picks the fastest way measured through each driver;
``benchmarks/drain.py`` measures these ways against the fastest raw writes of the same rows.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    DateTime,
    Dialect,
    String,
    Table,
    and_,
    bindparam,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.dml import Update

from seckill.store.tables import Order, UTCDateTime

ORDERS: Table = Order.__table__  # type: ignore[assignment]

# An order moving forward: the values of `_Advance.row` (store/landing.py), and the time of the
# move.
_ADVANCE_PARAMETERS = (
    "b_id", "b_from", "b_status", "b_paid_at", "b_released_at", "b_reason", "b_payment_id",
)  # fmt: skip
_ADVANCE_ORDER = (
    update(Order)
    .where(and_(Order.id == bindparam("b_id"), Order.status == bindparam("b_from")))
    .values(
        status=bindparam("b_status"),
        # Set once: a refund after the release keeps the release's time and reason.
        # (Typed parameters: inside COALESCE they would not get the column's bind processing.)
        paid_at=func.coalesce(Order.paid_at, bindparam("b_paid_at", type_=UTCDateTime())),
        released_at=func.coalesce(
            Order.released_at, bindparam("b_released_at", type_=UTCDateTime())
        ),
        release_reason=func.coalesce(
            Order.release_reason, bindparam("b_reason", type_=Order.release_reason.type)
        ),
        payment_id=func.coalesce(
            Order.payment_id, bindparam("b_payment_id", type_=Order.payment_id.type)
        ),
        updated_at=bindparam("b_now"),
    )
)


def _advance_from_arrays() -> Update:
    """`_ADVANCE_ORDER` for every row at once on PostgreSQL: its parameters as arrays."""
    array_types = (BigInteger, String, String, DateTime, DateTime, String, String)
    moves = (
        func.unnest(
            *(
                bindparam(name, type_=ARRAY(t))
                for name, t in zip(_ADVANCE_PARAMETERS, array_types, strict=True)
            )
        )
        .table_valued(
            "id", "from_status", "status", "paid_at", "released_at", "reason", "payment_id"
        )
        .render_derived(name="moves")
    )
    return (
        update(Order)
        .where(Order.id == moves.c.id, Order.status == moves.c.from_status)
        .values(
            status=moves.c.status,
            paid_at=func.coalesce(Order.paid_at, moves.c.paid_at),
            released_at=func.coalesce(Order.released_at, moves.c.released_at),
            release_reason=func.coalesce(Order.release_reason, moves.c.reason),
            payment_id=func.coalesce(Order.payment_id, moves.c.payment_id),
            updated_at=bindparam("b_now", type_=DateTime()),
        )
    )


_ADVANCE_FROM_ARRAYS = _advance_from_arrays()


class Bulk:
    """Any other backend (MySQL): ``IN (...)`` with the ids written out, SQLAlchemy's
    executemany with the column types' own processing, one UPDATE per order moved."""

    single_writer: ClassVar[bool] = False  # one write transaction at a time on the database

    def one_of(self, column: ColumnElement[Any]) -> ColumnElement[bool]:
        """``column`` is one of the whole numbers given as parameter ``ids`` when the statement
        runs: written into it then, which is cheaper than a thousand bound parameters."""
        return column.in_(bindparam("ids", expanding=True, literal_execute=True))

    def db_time(self, moment: datetime) -> Any:
        """An aware UTC time as this way of inserting takes it."""
        return moment

    async def insert(
        self,
        conn: AsyncConnection,
        table: Table,
        columns: Sequence[str],
        rows: Sequence[tuple[Any, ...]],
    ) -> None:
        """Insert ``rows``, tuples of ``columns``' values, into ``table``."""
        await conn.execute(insert(table), [dict(zip(columns, row, strict=True)) for row in rows])

    async def advance(
        self, conn: AsyncConnection, rows: Sequence[tuple[Any, ...]], now: Any
    ) -> int:
        """Move orders on record forward (``rows`` as ``_Advance.row`` makes them), each only
        from the status it names; returns how many moved."""
        moved = 0
        for row in rows:  # one statement each, counted by every driver
            parameters = dict(zip(_ADVANCE_PARAMETERS, row, strict=True))
            moved += (await conn.execute(_ADVANCE_ORDER, {**parameters, "b_now": now})).rowcount
        return moved


class _DriverValues(Bulk):
    """The ways that hand values to the driver itself, past SQLAlchemy's column types."""

    def db_time(self, moment: datetime) -> Any:
        return moment.replace(tzinfo=None)  # UTC, as UTCDateTime stores it


class PostgresBulk(_DriverValues):
    """PostgreSQL through asyncpg: ids as one array parameter, rows by ``COPY ... FROM STDIN``
    in the binary format (which beats executemany and ``INSERT ... SELECT FROM unnest(...)``
    here), orders moved by one ``UPDATE ... FROM unnest(...)``."""

    def one_of(self, column: ColumnElement[Any]) -> ColumnElement[bool]:
        # `IN (SELECT unnest($1))`, which plans without looking at the ids: `= ANY($1)`, planned
        # afresh for batches of 500, took 15 to 50 ms as the orders grew to 10,000 (executing
        # in under 3), against about 3 for this.
        return column.in_(select(func.unnest(bindparam("ids", type_=ARRAY(BigInteger)))))

    async def insert(
        self,
        conn: AsyncConnection,
        table: Table,
        columns: Sequence[str],
        rows: Sequence[tuple[Any, ...]],
    ) -> None:
        async with _driver_connection(conn, f"COPY {table.name}") as driver:
            if not driver.is_in_transaction():  # SQLAlchemy begins it with the first statement
                raise RuntimeError("COPY outside the batch's transaction")
            await driver.copy_records_to_table(table.name, records=rows, columns=list(columns))

    async def advance(
        self, conn: AsyncConnection, rows: Sequence[tuple[Any, ...]], now: Any
    ) -> int:
        columns = zip(*rows, strict=True)
        parameters = {
            name: list(values) for name, values in zip(_ADVANCE_PARAMETERS, columns, strict=True)
        }
        result = await conn.execute(_ADVANCE_FROM_ARRAYS, {**parameters, "b_now": now})
        return result.rowcount


class MariaDBBulk(_DriverValues):
    """MariaDB through asyncmy: one prepared INSERT bound to every row at once
    (``COM_STMT_BULK_EXECUTE``: binary values, one round trip), as fast here as a multi-row
    INSERT built beforehand, and twice asyncmy's executemany (which escapes every value into one
    such INSERT); orders moved likewise, by one UPDATE bound to each. MySQL lacks the command:
    it keeps SQLAlchemy's ways."""

    async def insert(
        self,
        conn: AsyncConnection,
        table: Table,
        columns: Sequence[str],
        rows: Sequence[tuple[Any, ...]],
    ) -> None:
        # The command types each column by its values: a column NULL in every row is left out
        # (a nullable column of these tables defaults to NULL).
        values = list(zip(*rows, strict=True))
        kept = [i for i, column in enumerate(values) if column.count(None) < len(column)]
        statement = _insert_text(conn, table, [columns[i] for i in kept])
        async with _driver_connection(conn, statement) as driver:
            prepared = await driver.prepare(statement)
            try:
                await prepared.execute_bulk(list(zip(*(values[i] for i in kept), strict=True)))
            finally:
                await prepared.close()

    async def advance(
        self, conn: AsyncConnection, rows: Sequence[tuple[Any, ...]], now: Any
    ) -> int:
        statement, parameters = _advance_text(conn, rows, now)
        async with _driver_connection(conn, statement) as driver:
            prepared = await driver.prepare(statement)
            try:
                result = await prepared.execute_bulk(parameters)
            finally:
                await prepared.close()
        return int(result.affected_rows)  # rows matched: SQLAlchemy connects with FOUND_ROWS


class SQLiteBulk(_DriverValues):
    """SQLite through aiosqlite: rows and order moves by the driver's executemany of tuples, times
    as the text SQLAlchemy stores (UTC, to the microsecond). SQLAlchemy's executemany made a dict
    of each row and passed every value through its column's type."""

    single_writer = True

    def db_time(self, moment: datetime) -> Any:
        return moment.replace(tzinfo=None).isoformat(" ", timespec="microseconds")

    async def insert(
        self,
        conn: AsyncConnection,
        table: Table,
        columns: Sequence[str],
        rows: Sequence[tuple[Any, ...]],
    ) -> None:
        statement = _insert_text(conn, table, columns)
        async with _driver_connection(conn, statement) as driver:
            await driver.executemany(statement, rows)

    async def advance(
        self, conn: AsyncConnection, rows: Sequence[tuple[Any, ...]], now: Any
    ) -> int:
        statement, parameters = _advance_text(conn, rows, now)
        async with _driver_connection(conn, statement) as driver:
            cursor = await driver.executemany(statement, parameters)
            moved = int(cursor.rowcount)  # summed over the rows
            await cursor.close()
        return moved


def _insert_text(conn: AsyncConnection, table: Table, columns: Sequence[str]) -> str:
    """``INSERT`` of ``columns`` into ``table``, one ``?`` per value, as the drivers that take
    statements as text read it (asyncmy's prepared statements, aiosqlite)."""
    quote = conn.dialect.identifier_preparer.quote
    return (
        f"INSERT INTO {quote(table.name)} ({', '.join(map(quote, columns))}) "
        f"VALUES ({', '.join('?' * len(columns))})"
    )


def _advance_text(
    conn: AsyncConnection, rows: Sequence[tuple[Any, ...]], now: Any
) -> tuple[str, list[tuple[Any, ...]]]:
    """``_ADVANCE_ORDER`` as text with ``?`` placeholders, and each row's parameters for it
    (``rows`` as ``_Advance.row`` makes them). A time, reason or payment NULL in every row is
    left out (COALESCE(x, NULL) is x): MariaDB's bulk command types a column by its values."""
    ids, froms, statuses, *once_values = zip(*rows, strict=True)
    once = [
        (name, values)
        for name, values in zip(
            ("paid_at", "released_at", "release_reason", "payment_id"), once_values, strict=True
        )
        if values.count(None) < len(values)
    ]
    quote = conn.dialect.identifier_preparer.quote
    assignments = [
        f"{quote('status')} = ?",
        *(f"{quote(name)} = COALESCE({quote(name)}, ?)" for name, _ in once),
        f"{quote('updated_at')} = ?",
    ]
    statement = (
        f"UPDATE {quote(ORDERS.name)} SET {', '.join(assignments)} "
        f"WHERE {quote('id')} = ? AND {quote('status')} = ?"
    )
    parameters = zip(
        statuses, *(values for _, values in once), [now] * len(rows), ids, froms, strict=True
    )
    return statement, list(parameters)


# Each way holds no state: one of each serves every batch, and statements built for a way once
# (``store/landing.py``) are kept by it.
_POSTGRES, _MARIADB, _SQLITE, _ANY = PostgresBulk(), MariaDBBulk(), SQLiteBulk(), Bulk()


def bulk_for(dialect: Dialect) -> Bulk:
    """The fastest ways measured through ``dialect``'s driver."""
    if dialect.driver == "asyncpg":
        return _POSTGRES
    if dialect.driver == "asyncmy" and getattr(dialect, "is_mariadb", False):
        return _MARIADB
    if dialect.driver == "aiosqlite":
        return _SQLITE
    return _ANY


@asynccontextmanager
async def _driver_connection(conn: AsyncConnection, statement: str) -> AsyncIterator[Any]:
    """The driver's own connection under ``conn``, inside the batch's transaction. Its errors
    come out as SQLAlchemy's do (a DBAPIError carrying the driver's), so that ``is_transient``
    tells an outage from rows the database refused."""
    raw = await conn.get_raw_connection()
    try:
        yield raw.driver_connection
    except (OSError, TimeoutError):
        raise
    except Exception as exc:
        raise DBAPIError.instance(statement, None, exc, Exception, dialect=conn.dialect) from exc
