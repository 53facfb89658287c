"""Auto-pipelining: the Redis commands issued in one event-loop tick leave in one write.

Why: redis-py spends more time per call than Redis spends running a purchase script, so when
every call takes its own round trip on its own pooled connection one process tops out near
10k calls/s. Sent together, many purchases share one write, one read and one wake-up. Redis
still runs them one after another in the order sent, each script atomic on its own: a batch is
not a transaction, and every caller gets its own reply or its own error reply.

Each connection is an asyncio protocol of our own rather than a redis-py connection: hiredis
parses the replies as the bytes arrive and each is handed to its caller's future right there,
in order, with no coroutine, timeout context or read call per reply (a third of the cost of a
purchase in this process, measured with benchmarks/engine.py).

A connection that fails mid-batch (lost, timed out, closed) fails every call of that batch not
yet answered with redis-py's ConnectionError or TimeoutError. As for a single call, the outcome
of a command already sent is then unknown: it may have run. Retrying a purchase is safe because
its idempotency key answers a repeat with the first answer.
"""

from __future__ import annotations

import asyncio
import functools
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import hiredis
from redis._parsers import BaseParser
from redis.asyncio.connection import RedisSSLContext, parse_url
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import EncodableT

# With two, a batch is sent while the previous one's replies are read. benchmarks/redis_clients.py,
# 64 calls in flight, on redis-py's connections: 1, 2 and 4 gave medians of 11.1k, 14.0k and
# 12.9k calls/s; a third or fourth was hardly ever busy (the batch sizes were the same as with two).
DEFAULT_CONNECTIONS = 2
# Bounds one write and one batch's memory; far above what a tick of purchases queues.
DEFAULT_MAX_BATCH = 512
# redis-py's defaults, which a URL may change (?socket_timeout=2&socket_connect_timeout=1).
DEFAULT_TIMEOUT_S = 5.0

Pending = tuple[tuple[EncodableT, ...], asyncio.Future[Any]]


class PipelinerClosed(RedisConnectionError):
    """A command issued after ``Pipeliner.aclose()``, or still unanswered when it ran."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Address:
    """Where and how to connect, from a redis://, rediss:// or unix:// URL as redis-py reads it:
    user, password and db; socket_timeout and socket_connect_timeout (seconds); for rediss://,
    the ssl_* options of redis-py's SSLConnection (certificates required by default)."""

    host: str = "localhost"
    port: int = 6379
    path: str | None = None  # a unix socket
    ssl: Any = None  # an ssl.SSLContext for rediss://
    username: str | None = None
    password: str | None = None
    db: int = 0
    timeout_s: float = DEFAULT_TIMEOUT_S
    connect_timeout_s: float = DEFAULT_TIMEOUT_S

    @classmethod
    def from_url(cls, url: str, ssl_options: Mapping[str, Any] | None = None) -> Address:
        """``ssl_options``: for rediss://, redis-py's ``ssl_*`` keyword arguments, which the
        URL's own (``?ssl_ca_certs=...``) override, as in redis-py."""
        options = cast(dict[str, Any], {**(ssl_options or {}), **parse_url(url)})
        ssl = None
        if url.startswith("rediss://"):
            settings: dict[str, Any] = {"cert_reqs": "required", "check_hostname": True}
            for name, value in options.items():
                if name.startswith("ssl_"):
                    settings[name.removeprefix("ssl_")] = value
            ssl = RedisSSLContext(**settings).get()
        return cls(
            host=options.get("host", "localhost"),
            port=options.get("port", 6379),
            path=options.get("path"),
            ssl=ssl,
            username=options.get("username"),
            password=options.get("password"),
            db=options.get("db", 0),
            timeout_s=options.get("socket_timeout", DEFAULT_TIMEOUT_S),
            connect_timeout_s=options.get("socket_connect_timeout", DEFAULT_TIMEOUT_S),
        )

    def handshake(self) -> list[tuple[EncodableT, ...]]:
        """The commands a new connection sends before any other."""
        commands: list[tuple[EncodableT, ...]] = []
        if self.password is not None:
            user = () if self.username is None else (self.username,)
            commands.append(("AUTH", *user, self.password))
        if self.db:
            commands.append(("SELECT", self.db))
        return commands


class Pipeliner:
    """Sends concurrent Redis commands in batches, on ``connections`` connections of its own.

    ``execute`` queues a command and returns a future of its reply; the first command of a tick
    schedules a flush for the end of the tick. The flush writes what is queued (at most
    ``max_batch`` commands per write) on an idle connection, whose replies then resolve the
    batch's futures in order as they arrive. While every connection has a batch in flight,
    commands stay queued, and the first connection to get all its replies writes them: the
    busier Redis is, the bigger the batches. A batch not fully answered within the URL's
    socket_timeout fails, and its connection is dropped. For a rediss:// URL, ``ssl_options``
    are redis-py's ``ssl_*`` keyword arguments (the CA file, the client's certificate and key,
    ``ssl_check_hostname``): the TLS context is built from them once, when constructed.

    Replies are raw, without redis-py's per-command response callbacks (EVALSHA and GET have
    none); error replies are redis-py's exception classes. ``batch_sizes`` counts the batches
    written, by size.
    """

    def __init__(
        self,
        url: str,
        *,
        connections: int = DEFAULT_CONNECTIONS,
        max_batch: int = DEFAULT_MAX_BATCH,
        ssl_options: Mapping[str, Any] | None = None,
    ) -> None:
        if connections < 1 or max_batch < 1:
            raise ValueError(f"connections and max_batch must be >= 1: {connections}, {max_batch}")
        self._address = Address.from_url(url, ssl_options)
        self._max_batch = max_batch
        self._queue: deque[Pending] = deque()
        self._idle: list[_Connection] = [_Connection(self) for _ in range(connections)]
        self._all = list(self._idle)
        self._flush_scheduled = False
        self._closed = False
        self.batch_sizes: Counter[int] = Counter()

    def execute(self, *args: EncodableT) -> asyncio.Future[Any]:
        """Queue one command, e.g. ``execute("EVALSHA", sha, 2, k1, k2, a1)``; await its reply.

        An error reply raises (ResponseError, NoScriptError, ...) for this command only.
        """
        if self._closed:
            raise PipelinerClosed("the Redis pipeliner is closed")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.append((args, future))
        if not self._flush_scheduled and self._idle:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return future

    async def aclose(self) -> None:
        """Fail what is queued or in flight with PipelinerClosed; close the connections."""
        self._closed = True
        closed = PipelinerClosed("the Redis pipeliner closed before sending this")
        _fail((future for _, future in self._queue), closed)
        self._queue.clear()
        await asyncio.gather(*(connection.close() for connection in self._all))

    def _flush(self) -> None:
        self._flush_scheduled = False
        while self._idle and self._queue and not self._closed:
            self._idle.pop().send(self._take())

    def _take(self) -> list[Pending]:
        batch: list[Pending] = []
        queue = self._queue
        while queue and len(batch) < self._max_batch:
            pending = queue.popleft()
            if not pending[1].done():  # else its caller was cancelled before it was sent
                batch.append(pending)
        return batch

    def _done(self, connection: _Connection) -> None:
        """A connection got every reply of its batch (or lost the batch): it takes what waits."""
        if self._closed:
            return
        if self._queue:
            connection.send(self._take())
        else:
            self._idle.append(connection)


class _Connection:
    """One of the pipeliner's connections: writes a batch and hands the pipeliner back its turn
    once the batch is answered or lost. Opened when first needed, opened again after a loss."""

    def __init__(self, pipeliner: Pipeliner) -> None:
        self._pipeliner = pipeliner
        self._link: _Link | None = None
        self._opening: asyncio.Task[None] | None = None

    def send(self, batch: list[Pending]) -> None:
        """Write a batch now, or once the connection is open."""
        if not batch:
            self._pipeliner._done(self)
        elif self._link is not None and self._link.error is None:
            self._write(self._link, batch)
        else:
            opening = asyncio.get_running_loop().create_task(self._open_then_write(batch))
            opening.add_done_callback(functools.partial(self._fail_if_cancelled, batch))
            self._opening = opening

    async def _open_then_write(self, batch: list[Pending]) -> None:
        try:
            self._link = await _Link.open(self._pipeliner._address, self._answered)
        except Exception as exc:
            _fail((future for _, future in batch), _as_connection_error(exc, "connecting"))
            self._pipeliner._done(self)
        else:
            self._write(self._link, batch)
        finally:
            self._opening = None

    def _write(self, link: _Link, batch: list[Pending]) -> None:
        written = link.write(batch)
        if written:
            self._pipeliner.batch_sizes[written] += 1

    def _fail_if_cancelled(self, batch: list[Pending], opening: asyncio.Task[None]) -> None:
        if opening.cancelled():  # by aclose, perhaps before it ran a line
            closed = PipelinerClosed("the Redis pipeliner closed before sending this")
            _fail((future for _, future in batch), closed)

    def _answered(self) -> None:
        self._pipeliner._done(self)

    async def close(self) -> None:
        if self._opening is not None:
            self._opening.cancel()
            await asyncio.gather(self._opening, return_exceptions=True)
        if self._link is not None:
            self._link.lose(PipelinerClosed("the Redis pipeliner closed before this was answered"))


class _Link(asyncio.Protocol):
    """One open connection: replies resolve the waiting futures in order as they arrive.

    ``answered`` is called when a batch has all its replies, or failed with the connection.
    """

    def __init__(self, address: Address) -> None:
        self._address = address
        self._reader = hiredis.Reader(encoding="utf-8", replyError=BaseParser.parse_error)
        self._waiting: deque[asyncio.Future[Any]] = deque()
        self._transport: asyncio.Transport | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._answered: Callable[[], None] | None = None  # set once the handshake is done
        self.error: Exception | None = None  # why it was lost: nothing more is written on it

    @classmethod
    async def open(cls, address: Address, answered: Callable[[], None]) -> _Link:
        """Connect and send the handshake; raise if either fails."""
        link, loop = cls(address), asyncio.get_running_loop()
        try:
            async with asyncio.timeout(address.connect_timeout_s):
                if address.path is not None:
                    await loop.create_unix_connection(lambda: link, address.path)
                else:
                    await loop.create_connection(
                        lambda: link, address.host, address.port, ssl=address.ssl
                    )
                handshake = address.handshake()
                if handshake:
                    await asyncio.gather(*link._send(handshake))
        except BaseException as exc:
            link.lose(_as_connection_error(exc, "connecting"))
            raise
        link._answered = answered
        return link

    def write(self, batch: list[Pending]) -> int:
        """Send a batch; how many of its commands were sent (the others could not be encoded)."""
        waiting: list[asyncio.Future[Any]] = []
        packed: list[bytes] = []
        for args, future in batch:
            try:
                # hiredis's packer (a dependency via redis[hiredis]): the same bytes as redis-py's
                # pack_command in an eighth of the time (1.7 µs against 13.7 µs per purchase).
                packed.append(hiredis.pack_command(cast(Any, args)))
            except TypeError as exc:  # an argument that cannot be encoded: this command's error
                future.set_exception(DataError(str(exc)))
            else:
                waiting.append(future)
        if self.error is not None:
            _fail(waiting, self.error)
            waiting = []
        if not waiting:
            assert self._answered is not None
            self._answered()
            return 0
        assert self._transport is not None
        self._waiting.extend(waiting)
        self._deadline = asyncio.get_running_loop().call_later(
            self._address.timeout_s, self._timed_out
        )
        self._transport.write(b"".join(packed))
        return len(waiting)

    def _send(self, commands: list[tuple[EncodableT, ...]]) -> list[asyncio.Future[Any]]:
        assert self._transport is not None
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in commands]
        self._waiting.extend(futures)
        self._transport.write(b"".join(hiredis.pack_command(cast(Any, c)) for c in commands))
        return futures

    def lose(self, error: Exception) -> None:
        """Close the connection and fail its unanswered calls (their replies may still be on the
        way, so nothing more is sent on it)."""
        if self.error is not None:
            return
        self.error = error
        if self._deadline is not None:
            self._deadline.cancel()
        if self._transport is not None:
            self._transport.abort()
        waiting, self._waiting = self._waiting, deque()
        _fail(waiting, error)
        if waiting and self._answered is not None:
            self._answered()

    def _timed_out(self) -> None:
        self.lose(RedisTimeoutError(f"Redis did not answer in {self._address.timeout_s} s"))

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        reader, waiting = self._reader, self._waiting
        reader.feed(data)
        try:
            while (reply := reader.gets()) is not False:
                if not waiting:
                    raise hiredis.ProtocolError("a reply nobody asked for")
                future = waiting.popleft()
                if not future.done():  # a caller that gave up: its reply is read all the same
                    if isinstance(reply, Exception):  # an error reply, as redis-py's class for it
                        future.set_exception(reply)
                    else:
                        future.set_result(reply)
                if not waiting:
                    if self._deadline is not None:
                        self._deadline.cancel()
                        self._deadline = None
                    if self._answered is not None:
                        self._answered()
        except hiredis.ProtocolError as exc:
            self.lose(RedisConnectionError(f"Redis sent what is not a reply: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if exc is None:
            self.lose(RedisConnectionError("Redis closed the connection"))
        else:
            self.lose(_as_connection_error(exc, "reading"))


def _as_connection_error(exc: BaseException, doing: str) -> Exception:
    """What the callers of a failed batch see: redis-py's types, which the API maps to 503."""
    if isinstance(exc, RedisConnectionError | RedisTimeoutError | ResponseError):
        return exc  # ResponseError: the handshake was refused (a wrong password)
    if isinstance(exc, TimeoutError):
        error: Exception = RedisTimeoutError(f"Redis timed out while {doing}: {exc}")
    else:
        error = RedisConnectionError(f"Redis connection failed while {doing}: {exc!r}")
    error.__cause__ = exc
    return error


def _fail(futures: Iterable[asyncio.Future[Any]], error: Exception) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(error)
