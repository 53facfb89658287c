"""Opening the database: one async engine, tuned per backend; and telling an outage apart."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import (
    DBAPIError,
    DisconnectionError,
    IntegrityError,
    InterfaceError,
    OperationalError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

# The share of a request's deadline a statement may wait for a lock (see ``open_database``).
LOCK_WAIT_SHARE = 0.75


def open_database(
    url: str,
    *,
    pool_size: int = 10,
    max_overflow: int = 10,
    deadline_s: float | None = None,
    tls: ssl.SSLContext | None = None,
) -> AsyncEngine:
    """An engine for ``url``. SQLite gets WAL and a busy timeout, so several processes can share
    the file; servers get a pre-ping so a restarted server is survived.

    ``tls``: a server's connections speak TLS with this context (see
    ``seckill.bootstrap.tls``), both drivers' (asyncpg, asyncmy) ``ssl`` argument; None leaves
    the URL's options and the driver's defaults.

    ``deadline_s``: the longest a connection, a statement or a wait for a pooled connection may
    take before it fails as an outage (``is_transient``): for requests, which must answer (503)
    rather than hang on a server that accepts connections and answers nothing; a server's lock
    waits end sooner (``LOCK_WAIT_SHARE`` of it), as busy (``is_busy``). Without it, the
    drivers' own (generous) bounds hold, as workers want: a batch may take a while under load.
    On SQLite it also queues the engine's write transactions in the process (``SerialWrites``).

    PostgreSQL through a transaction pooler (PgBouncer): the URL says so with
    ``prepared_statement_cache_size=0`` (``through_transaction_pooler``)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if tls is not None:
            raise ValueError("a SQLite file has no connection to encrypt: no TLS context for it")
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        busy_s = deadline_s or 30.0
        engine = create_async_engine(url, connect_args={"timeout": busy_s})

        @event.listens_for(engine.sync_engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA busy_timeout={int(busy_s * 1000)}")
            cursor.close()

        return engine if deadline_s is None else SerialWrites(engine.sync_engine, wait_s=deadline_s)
    options: dict[str, Any] = {}
    # A lock wait ends on the server a little before the deadline, as an error that says the
    # server is busy (``is_busy``): past the deadline, it could not be told from silence.
    lock_wait_s = LOCK_WAIT_SHARE * deadline_s if deadline_s else None
    lock_timeout: str | None = None  # set per transaction, through a transaction pooler
    # Bounded waits: a server that vanishes without a reset must not hang a worker for minutes.
    if parsed.get_backend_name() in {"mysql", "mariadb"}:
        # READ COMMITTED: no gap locks, so persisters inserting new orders do not block each other.
        options["isolation_level"] = "READ COMMITTED"
        options["connect_args"] = {"connect_timeout": deadline_s or 10}
        if deadline_s:
            options["connect_args"]["read_timeout"] = deadline_s
        if lock_wait_s:  # whole seconds, at least 1
            wait = max(1, int(lock_wait_s))
            options["connect_args"]["init_command"] = f"SET SESSION innodb_lock_wait_timeout={wait}"
    elif parsed.get_backend_name() == "postgresql":
        options["connect_args"] = {
            "timeout": deadline_s or 10,
            "command_timeout": deadline_s or 60,
        }
        pooled = through_transaction_pooler(url)
        if pooled:
            # A server connection serves many clients, one transaction at a time: asyncpg's
            # statement cache off, so every statement is prepared unnamed, in the transaction
            # that runs it (a named one would stay on the server connection, where another
            # client's of the same name collides with it, or be looked for on another).
            options["connect_args"]["statement_cache_size"] = 0
        if lock_wait_s:
            ms = f"{max(1, int(lock_wait_s * 1000))}ms"
            if pooled:  # a startup setting would reach no server connection: per transaction
                lock_timeout = ms
            else:
                options["connect_args"]["server_settings"] = {"lock_timeout": ms}
    if tls is not None:
        options.setdefault("connect_args", {})["ssl"] = tls
    if deadline_s:
        options["pool_timeout"] = deadline_s
    engine = create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=True,
        pool_recycle=3600,
        **options,
    )
    if lock_timeout is not None:
        setting = text("SELECT set_config('lock_timeout', :wait, true)").bindparams(
            wait=lock_timeout
        )

        @event.listens_for(engine.sync_engine, "begin")
        def _lock_timeout(connection: Any) -> None:
            connection.execute(setting)  # is_local: it ends with the transaction

    return engine


def through_transaction_pooler(url: str) -> bool:
    """Does ``url`` reach PostgreSQL through a pooler in transaction mode (PgBouncer's
    ``pool_mode = transaction``)? It says so with SQLAlchemy's own parameter
    ``prepared_statement_cache_size=0`` (no prepared statement is kept between transactions,
    which may each run on another server connection); ``open_database`` then also turns
    asyncpg's statement cache off (statements are prepared unnamed), and sets the request
    engine's ``lock_timeout`` in each transaction (``SET LOCAL``) rather than at connection
    start, where the pooler would refuse it or keep it for one server connection."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        return False
    size = parsed.query.get("prepared_statement_cache_size")
    return (size[-1] if isinstance(size, tuple) else size) == "0"


class WriteQueueTimeout(PoolTimeout):
    """A write transaction waited for its turn (``SerialWrites``) past its bound: the database
    is busy, as when a pooled connection is not free in time."""


class SerialWrites(AsyncEngine):
    """A SQLite engine whose write transactions (``begin()``) take turns in this process.

    SQLite has one writer. Left to its busy handler, concurrent writers poll for the lock with
    sleeps of up to 100 ms, so it lies idle while they sleep, and each holds it across event-loop
    turns; under load (16 item creations at once while the loop is busy) the last waiters passed
    the busy timeout and were refused as if the database were gone. Queued here, each write
    starts as the one before it ends, in arrival order, and waits as long as the queue moves: it
    gives up (``WriteQueueTimeout``) only when no write ended for ``wait_s``. SQLite's busy
    timeout then covers other processes' writes only. Reads do not queue: WAL lets them run
    beside the writer."""

    __slots__ = ("_ended", "_turn", "_wait_s")

    def __init__(self, sync_engine: Engine, *, wait_s: float) -> None:
        super().__init__(sync_engine)
        self._turn = asyncio.Lock()
        self._wait_s = wait_s
        self._ended = 0  # writes ended so far: the queue's progress

    @contextlib.asynccontextmanager
    async def begin(self) -> AsyncIterator[AsyncConnection]:
        # The turn covers the transaction only: taking a pooled connection (perhaps opening
        # it) and handing it back happen outside it, beside the writes of others.
        async with self.connect() as conn:
            await self._take_turn()
            try:
                async with conn.begin():
                    yield conn
            finally:
                self._ended += 1
                self._turn.release()

    async def _take_turn(self) -> None:
        # The acquisition runs as a task of its own, so a waiter keeps its place while it looks
        # at the queue's progress.
        acquiring = asyncio.ensure_future(self._turn.acquire())
        try:
            seen = self._ended
            while not acquiring.done():
                await asyncio.wait({acquiring}, timeout=self._wait_s)
                if not acquiring.done() and self._ended == seen:
                    raise WriteQueueTimeout(
                        f"no write to SQLite ended within {self._wait_s} s: it is busy"
                    )
                seen = self._ended
        except BaseException:
            if not acquiring.cancel() and not acquiring.cancelled():
                self._turn.release()  # acquired as we gave up: the next waiter's turn
            raise


async def create_database(server_url: str, name: str) -> str:
    """Create database ``name`` on the server ``server_url`` points at; returns its URL.

    For test sessions and benchmarks that want a database of their own.
    """
    if not name.isidentifier():
        raise ValueError(f"not a plain database name: {name!r}")
    url = make_url(server_url)
    await _admin(server_url, f"CREATE DATABASE {name}")
    return url.set(database=name).render_as_string(hide_password=False)


async def drop_database(server_url: str, name: str) -> None:
    if not name.isidentifier():
        raise ValueError(f"not a plain database name: {name!r}")
    await _admin(server_url, f"DROP DATABASE IF EXISTS {name}")


async def _admin(server_url: str, statement: str) -> None:
    admin = create_async_engine(make_url(server_url), isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            await conn.execute(text(statement))
    finally:
        await admin.dispose()


# Errors that say nothing about the entries: the server is away, busy, or chose a victim.
_MYSQL_TRANSIENT = {1040, 1053, 1205, 1213, 1927, 2002, 2003, 2006, 2013, 2055}
_PG_TRANSIENT = ("08", "40001", "40P01", "53", "55P03", "57P")  # SQLSTATE classes and codes
# Of those, the ones that say the server answers but is busy: a lock wait timed out, a deadlock's
# or a serialization failure's victim.
_MYSQL_BUSY = {1205, 1213}
_PG_BUSY = ("40001", "40P01", "55P03")  # 55P03: lock_timeout


# A unique key already taken: PostgreSQL's SQLSTATE, MySQL/MariaDB's ER_DUP_ENTRY.
_PG_UNIQUE = "23505"
_MYSQL_UNIQUE = 1062


def is_race(exc: BaseException) -> bool:
    """Did a unique key refuse the write (True)? Landing looks before it writes (an order's row,
    a journal entry, a refund), so such a refusal means a concurrent transaction took the key
    between the look and the write, as two persisters landing the first events of one order do:
    the batch lands on a second try, which finds the other's rows."""
    if not isinstance(exc, DBAPIError):
        return False
    code = _mysql_code(exc)
    if code is not None:
        return code == _MYSQL_UNIQUE
    sqlstate = getattr(exc.orig, "sqlstate", None)
    if isinstance(sqlstate, str):
        return sqlstate == _PG_UNIQUE
    return isinstance(exc, IntegrityError) and "UNIQUE constraint failed" in str(exc.orig)


def _mysql_code(exc: DBAPIError) -> int | None:
    """A MySQL/MariaDB error's number (asyncmy gives a SQLSTATE too, but the number is precise:
    a lost connection and a lock wait share HY000)."""
    code = exc.orig.args[0] if exc.orig is not None and exc.orig.args else None
    return code if isinstance(code, int) else None


def is_transient(exc: BaseException) -> bool:
    """Is the database away or busy (True), or did it refuse what was sent (False)?

    The persister retries a batch as it is on True and blames its entries on False; the API
    answers 503 on True. A constraint failure is never transient, even where a driver files it under
    OperationalError (MariaDB's CHECK failure, 4025): that is what entries are split for.
    """
    if isinstance(exc, DisconnectionError | PoolTimeout | OSError | asyncio.TimeoutError):
        return True
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    code = _mysql_code(exc)
    if code is not None:
        return code in _MYSQL_TRANSIENT
    sqlstate = getattr(exc.orig, "sqlstate", None)
    if isinstance(sqlstate, str):
        return sqlstate.startswith(_PG_TRANSIENT)
    # SQLite: "database is locked" and I/O trouble are OperationalErrors; constraints are not.
    return isinstance(exc, OperationalError | InterfaceError)


def is_busy(exc: BaseException) -> bool:
    """Of the transient errors (``is_transient``), is the database busy (True) rather than away
    (False)? Busy: it answers, but a lock (a row's, SQLite's writer's: "database is locked") or
    a pooled connection or a turn to write was not free in time. Away: no connection (refused,
    unresolved, timed out) or no answer. The API answers 503 ``database_busy`` for the first,
    ``database_unavailable`` for the second: one decision, here."""
    if isinstance(exc, PoolTimeout):
        return True
    if not isinstance(exc, DBAPIError) or exc.connection_invalidated:
        return False
    code = _mysql_code(exc)
    if code is not None:
        return code in _MYSQL_BUSY
    sqlstate = getattr(exc.orig, "sqlstate", None)
    if isinstance(sqlstate, str):
        return sqlstate.startswith(_PG_BUSY)
    message = str(exc.orig).lower()
    return isinstance(exc, OperationalError) and ("locked" in message or "busy" in message)
