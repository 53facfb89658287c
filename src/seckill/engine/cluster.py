"""One Redis or a Redis Cluster: the same engine runs on both.

Every key of an item shares the hash tag ``{item:<id>}``, so each script and each read of one
item touches one slot. On a cluster only the way there differs: redis-py's ``RedisCluster``
routes each command by its key, following MOVED and ASK; the purchase path's batches
(``ClusterPipeliner``) go to the node that owns each key's slot; the few calls that must share
one connection (a write script and its WAIT) go through ``send_on_node``. Both use connections
of their own per node (``ClusterNodes``).

A slot whose primary is down answers with redis-py's ConnectionError (the API's 503) until its
replica is promoted; the slot map is then read again, and calls resume without a restart.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias
from urllib.parse import urlsplit, urlunsplit

from redis.asyncio import BlockingConnectionPool, ConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import EncodableT

from seckill.engine.pipelining import DEFAULT_CONNECTIONS, Pipeliner

RedisClient: TypeAlias = Redis | RedisCluster
"""A client of one Redis, or of a Redis Cluster (configured by ``Settings.redis_cluster``)."""

SLOT_UNAVAILABLE: tuple[type[Exception], ...] = (
    ClusterDownError,  # CLUSTERDOWN, MASTERDOWN: the slot has no primary right now
    TryAgainError,  # a multi-key call over a slot being migrated
    AskError,  # (and MovedError) redirects still unresolved after redis-py's retries
    RedisClusterException,  # no known node for the slot, the cluster unreachable
)
"""Cluster errors that mean "the slot cannot answer now": retrying later may succeed."""

REDIS_UNAVAILABLE: tuple[type[Exception], ...] = (
    RedisConnectionError, RedisTimeoutError, *SLOT_UNAVAILABLE
)  # fmt: skip
"""Every error that means "this Redis (or this slot's node) did not answer": one Redis down, or
one node of a cluster, where the others still answer."""

REDIS_FAILED: tuple[type[Exception], ...] = (RedisError, RedisClusterException)
"""Anything a Redis call may fail with, for work that goes on without it: redis-py's errors, and
the cluster client's RedisClusterException (no node to learn the slots from), which is none."""

# A slot map read again at most this often after a node failed: a down primary fails its calls
# at once, and its replica's promotion is seen within this long of the next call.
REFRESH_EVERY_S = 0.25
# Connections per node for the calls that must share one (a durable write and its WAIT).
POOL_PER_NODE = 64
# MOVED, ASK and TRYAGAIN followed for one call before it fails (a slot migrating twice at once).
MAX_REDIRECTS = 5
_TRYAGAIN_PAUSE_S = 0.02


def connect(
    url: str,
    *,
    cluster: bool,
    max_connections: int,
    ssl_options: Mapping[str, Any] | None = None,
) -> RedisClient:
    """A client of the Redis at ``url``, or of the cluster that ``url`` is a node of.

    ``max_connections`` bounds the one-Redis pool, where a burst beyond it waits. redis-py's
    cluster client cannot wait (past its bound a call fails), so on a cluster it is left
    unbounded: a burst opens what it needs per node, and the connections stay for the next.
    ``ssl_options``: for a rediss:// URL, redis-py's ``ssl_*`` keyword arguments (see
    ``seckill.bootstrap.tls``).
    """
    tls = dict(ssl_options or {})
    if cluster:
        return _Cluster.from_url(url, decode_responses=True, max_connections=2**31, **tls)
    pool = BlockingConnectionPool.from_url(
        url, decode_responses=True, max_connections=max_connections, **tls
    )
    return Redis.from_pool(pool)  # the client owns the pool and closes it


class _Cluster(RedisCluster):
    """redis-py's cluster client, whose calls on a connection to a node that just went away fail
    as a lost connection (the API's 503), as they do on one Redis."""

    async def execute_command(self, *args: EncodableT, **kwargs: Any) -> Any:
        try:
            return await super().execute_command(*args, **kwargs)
        except (RuntimeError, AttributeError) as exc:
            # redis-py 8.1 writes on such a connection's closed transport, or on none, and
            # raises the transport's own error (redis/redis-py#4287): a 500 without this.
            raise RedisConnectionError(f"connection lost: {exc!r}") from exc


def routing_key(args: Sequence[EncodableT]) -> str:
    """The key a command's slot is taken from: EVALSHA's first key, else the first argument."""
    name = str(args[0]).upper()
    if name in ("EVALSHA", "EVAL"):
        if int(args[2]) < 1:
            raise ValueError(f"{name} with no key cannot be routed on a cluster")
        return str(args[3])
    return str(args[1])


def node_url(seed_url: str, node: ClusterNode) -> str:
    """``seed_url`` (its scheme, credentials and options) pointed at ``node``."""
    parts = urlsplit(seed_url)
    credentials = parts.netloc.rpartition("@")[0]
    netloc = f"{credentials}@{node.host}:{node.port}" if credentials else f"{node.host}:{node.port}"
    return urlunsplit(parts._replace(netloc=netloc, path=""))


class ClusterNodes:
    """The primaries of a Redis Cluster as this process reaches them: redis-py's slot map (read
    again after a node failed, at most every ``REFRESH_EVERY_S``, one reading at a time) and,
    per node, connections of its own: a ``Pipeliner`` for batches, and a pool for calls that must
    share one connection. Of its own, because redis-py resets its cluster connections when the
    topology changes, and that must not fail a call in flight on a healthy node. Both speak
    TLS as ``seed_url`` and ``ssl_options`` say (those the cluster client was given)."""

    def __init__(
        self,
        cluster: RedisCluster,
        *,
        seed_url: str,
        connections: int = DEFAULT_CONNECTIONS,
        ssl_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.cluster = cluster
        self._seed_url = seed_url
        self._connections = connections
        self._ssl_options = dict(ssl_options or {})
        self._pipeliners: dict[str, Pipeliner] = {}
        self._pools: dict[str, ConnectionPool] = {}
        self._next_refresh = 0.0
        self._refreshing: asyncio.Task[None] | None = None

    def node_for(self, key: str) -> ClusterNode:
        try:
            node = self.cluster.get_node_from_key(key)
        except RedisClusterException as exc:  # the slot has no known owner now
            self.node_failed()
            raise RedisConnectionError(f"no Redis Cluster node serves {key!r} now: {exc}") from exc
        assert node is not None  # a primary is always asked for
        return node

    def pipeliner(self, node: ClusterNode) -> Pipeliner:
        found = self._pipeliners.get(node.name)
        if found is None:
            url = node_url(self._seed_url, node)
            found = self._pipeliners[node.name] = Pipeliner(
                url, connections=self._connections, ssl_options=self._ssl_options
            )
        return found

    def pool(self, node: ClusterNode) -> ConnectionPool:
        found = self._pools.get(node.name)
        if found is None:
            url = node_url(self._seed_url, node)
            # Blocking: a burst beyond it waits for a connection, as the one-Redis pool does.
            found = self._pools[node.name] = BlockingConnectionPool.from_url(
                url, decode_responses=True, max_connections=POOL_PER_NODE, **self._ssl_options
            )
        return found

    def batch_sizes(self) -> dict[str, Counter[int]]:
        """The batches each node's pipeliner wrote, by size."""
        return {name: pipeliner.batch_sizes for name, pipeliner in self._pipeliners.items()}

    def node_failed(self, node: ClusterNode | None = None) -> None:
        """A call failed for want of a node (``node``, when known): read the slot map again,
        and stop using that node as redis-py's default (which it asks when it re-reads the map
        itself: a dead default node fails every call of the client until it is replaced)."""
        default = self.cluster.get_default_node()
        if node is not None and (default is None or default.name == node.name):
            self._replace_default(node.name)
        now = time.monotonic()
        if now < self._next_refresh or (self._refreshing and not self._refreshing.done()):
            return
        self._next_refresh = now + REFRESH_EVERY_S
        self._refreshing = asyncio.get_running_loop().create_task(self._refresh())

    def _replace_default(self, failed: str) -> None:
        others = [p for p in self.cluster.get_primaries() if p.name != failed]
        if others:
            self.cluster.set_default_node(random.choice(others))

    async def _refresh(self) -> None:
        try:
            await self.cluster.nodes_manager.initialize()
        except Exception:
            self._next_refresh = 0.0
            return
        default = self.cluster.get_default_node()
        if default is None or default not in self.cluster.get_primaries():
            self._replace_default(default.name if default else "")

    async def aclose(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()
            await asyncio.gather(self._refreshing, return_exceptions=True)
        await asyncio.gather(*(p.aclose() for p in self._pipeliners.values()))
        await asyncio.gather(*(p.aclose() for p in self._pools.values()))


class ClusterPipeliner:
    """A ``Pipeliner`` per primary: each command joins the batch of the node owning its key.

    A reply that redirects (MOVED, ASK: the slot moved or is moving; TRYAGAIN) concerns only its
    own command, which is sent again through redis-py's cluster client: it follows the redirect
    and updates the slot map, so the next commands of that slot go to the new owner directly.
    A node that fails its connection fails only its own batch (see ``pipelining``).
    """

    def __init__(self, nodes: ClusterNodes) -> None:
        self.nodes = nodes

    async def execute(self, *args: EncodableT) -> Any:
        node = self.nodes.node_for(routing_key(args))
        try:
            return await self.nodes.pipeliner(node).execute(*args)
        except (MovedError, AskError, TryAgainError, ClusterDownError):
            return await self.nodes.cluster.execute_command(*args)
        except (RedisConnectionError, RedisTimeoutError):
            self.nodes.node_failed(node)
            raise

    async def aclose(self) -> None:
        await self.nodes.aclose()


async def send_on_node(
    nodes: ClusterNodes, key: str, commands: Sequence[Sequence[EncodableT]]
) -> list[Any]:
    """Send ``commands`` on one connection of the node that owns ``key``'s slot; their replies,
    error replies as exceptions in the list. For commands that must share a connection (a
    write and the WAIT that counts its replicas). The first command is the keyed one: a redirect
    of its reply sends them all again to the slot's owner, and a connection that could not be
    opened (nothing sent) is tried again on a fresh slot map."""
    asking: ClusterNode | None = None
    for _ in range(MAX_REDIRECTS):
        node = asking or nodes.node_for(key)
        sent = ([("ASKING",)] if asking else []) + list(commands)
        try:
            replies = await _send(nodes.pool(node), sent)
        except _NotSent:
            nodes.node_failed(node)
            await asyncio.sleep(_TRYAGAIN_PAUSE_S)
            continue
        except (RedisConnectionError, RedisTimeoutError):
            nodes.node_failed(node)
            raise
        replies = replies[1:] if asking else replies
        first, asking = replies[0], None
        if isinstance(first, MovedError):  # (a subclass of AskError)
            await nodes.cluster.nodes_manager.move_slot(first)
        elif isinstance(first, AskError):
            asking = nodes.cluster.get_node(host=first.host, port=first.port)
            if asking is None:
                await nodes.cluster.nodes_manager.initialize()
        elif isinstance(first, TryAgainError | ClusterDownError):
            await asyncio.sleep(_TRYAGAIN_PAUSE_S)
        else:
            return replies
    raise RedisConnectionError(
        f"the node serving {key!r} did not answer or its slot kept moving: "
        f"tried {MAX_REDIRECTS} times"
    )


class _NotSent(RedisConnectionError):
    """The connection could not be opened: the commands were never sent."""


async def _send(pool: ConnectionPool, commands: Sequence[Sequence[EncodableT]]) -> list[Any]:
    connection = await pool.get_connection()  # type: ignore[no-untyped-call]
    try:
        try:
            await connection.connect()  # a no-op when connected
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise _NotSent(str(exc)) from exc
        await connection.send_packed_command(connection.pack_commands(commands))
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(await connection.read_response())
            except ResponseError as exc:
                replies.append(exc)
        return replies
    except BaseException:
        await connection.disconnect()  # replies may be left unread
        raise
    finally:
        await pool.release(connection)


async def time_ms(redis: RedisClient, key: str | None = None) -> int:
    """Redis's clock (epoch ms): on a cluster, of the node that holds ``key`` (the clock its
    scripts read), or of any node."""
    if isinstance(redis, RedisCluster):
        node = redis.get_node_from_key(key) if key is not None else redis.get_random_node()
        sec, usec = await redis.time(target_nodes=node)
    else:
        sec, usec = await redis.time()
    return int(sec) * 1000 + int(usec) // 1000
