"""The runtime: Redis (or the embedded one), the scripts, the engine, order ids and the SQL
ledgers, wired from the settings and closed together."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from redis.asyncio.cluster import RedisCluster
from sqlalchemy.ext.asyncio import AsyncEngine

from seckill.bootstrap.checks import require_runnable
from seckill.bootstrap.tls import database_ssl_context, database_tls_refusal, redis_ssl_options
from seckill.config import Settings
from seckill.domain.configuration import ConfigurationError
from seckill.domain.ids import OrderIds
from seckill.engine.base import Clock, RateLimit
from seckill.engine.cluster import ClusterNodes, ClusterPipeliner, RedisClient, connect
from seckill.engine.engine import RedisEngine
from seckill.engine.pipelining import Pipeliner
from seckill.engine.scripts import Durability, Scripts
from seckill.engine.worker_ids import leased_order_ids
from seckill.redis_server import RedisServer
from seckill.store.database import is_transient, open_database
from seckill.store.ledger import Ledger
from seckill.store.migrate import schema_problem, upgrade

log = logging.getLogger(__name__)

# How long a process's start waits for the database to name its schema: one that does not
# answer by then (the outage a sale goes on through) lets the process start unchecked.
SCHEMA_CHECK_S = 3.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Runtime:
    settings: Settings
    redis: RedisClient
    engine: RedisEngine
    order_ids: OrderIds
    ledger: Ledger  # workers and commands: the drivers' own bounds
    # HTTP requests: every statement bounded by SECKILL_SQL_REQUEST_TIMEOUT_SECONDS (a pool of
    # its own, opened on first use).
    request_ledger: Ledger
    embedded_redis: RedisServer | None


@contextlib.asynccontextmanager
async def open_runtime(settings: Settings, *, clock: Clock | None = None) -> AsyncIterator[Runtime]:
    """Connect everything (starting the embedded Redis if no URL is set); close it all on exit.

    Raises ``ConfigurationError`` before connecting anything when the settings cannot run
    under their profile, or name TLS files that cannot be used (see ``seckill.bootstrap.tls``)."""
    require_runnable(settings)
    redis_tls = redis_ssl_options(settings)  # the files checked before anything connects
    database_tls = database_ssl_context(settings)
    async with contextlib.AsyncExitStack() as stack:
        embedded = None
        url = settings.redis_url
        if not url:
            embedded = RedisServer(
                binary=settings.redis_server_bin or None,
                data_dir=settings.data_dir / "redis",
                appendonly=True,  # the embedded Redis keeps its state across restarts
            )
            await asyncio.to_thread(embedded.start)
            stack.callback(embedded.stop)
            url = embedded.url
        redis = connect(
            url,
            cluster=settings.redis_cluster,
            max_connections=settings.redis_max_connections,
            ssl_options=redis_tls,
        )
        stack.push_async_callback(redis.aclose)
        # The purchase path's calls, batched on connections of their own (see pipelining),
        # per node on a cluster.
        pipeliner: Pipeliner | ClusterPipeliner
        if isinstance(redis, RedisCluster):
            await redis.initialize()  # the slot map, before the first call is routed
            nodes = ClusterNodes(redis, seed_url=url, ssl_options=redis_tls)
            pipeliner = ClusterPipeliner(nodes)
        else:
            pipeliner = Pipeliner(url, ssl_options=redis_tls)
        stack.push_async_callback(pipeliner.aclose)
        durability = (
            Durability(settings.redis_wait_replicas, settings.redis_wait_timeout_ms)
            if settings.redis_durability == "replicas"
            else None
        )
        # The one Scripts: the engine, the worker-id lease and everything built on the engine
        # (the item cache, the upkeep lock) call through it.
        scripts = Scripts(redis, durability=durability, pipeliner=pipeliner)
        await scripts.load()
        if settings.worker_id is not None:
            order_ids = OrderIds(settings.worker_id)
        else:
            order_ids = await stack.enter_async_context(
                leased_order_ids(
                    redis,
                    scripts=scripts,
                    prefix=settings.key_prefix,
                    ttl_ms=settings.worker_id_lease_seconds * 1000,
                )
            )
        pools = {"pool_size": settings.sql_pool_size, "max_overflow": settings.sql_max_overflow}
        database = open_database(settings.effective_database_url, tls=database_tls, **pools)
        stack.push_async_callback(database.dispose)
        bounded = open_database(
            settings.effective_database_url,
            deadline_s=settings.sql_request_timeout_seconds,
            tls=database_tls,
            **pools,
        )
        stack.push_async_callback(bounded.dispose)
        await prepare_schema(
            database, embedded=settings.database_url_is_default, currency=settings.currency
        )
        engine = RedisEngine(
            redis,
            scripts=scripts,
            idempotency_ttl_ms=settings.idempotency_ttl_seconds * 1000,
            prefix=settings.key_prefix,
            clock=clock,
            rate_limit=RateLimit(
                settings.rate_limit_requests, settings.rate_limit_window_seconds * 1000
            ),
        )
        yield Runtime(
            settings=settings,
            redis=redis,
            engine=engine,
            order_ids=order_ids,
            ledger=Ledger(database),
            request_ledger=Ledger(bounded),
            embedded_redis=embedded,
        )


async def prepare_schema(database: AsyncEngine, *, embedded: bool, currency: str) -> None:
    """The embedded SQLite file upgraded: it is ours to keep current. Any other database is the
    operator's (``seckill db upgrade``, once per release): one that answers with no schema or an
    older one stops the process with ``ConfigurationError``, before it writes what that schema
    cannot take."""
    if embedded:
        await upgrade(database, currency=currency)
        return
    try:
        async with asyncio.timeout(SCHEMA_CHECK_S):
            problem = await schema_problem(database)
    except Exception as exc:
        refusal = database_tls_refusal(exc)
        if refusal:  # a setting to fix, not an outage to ride out
            raise ConfigurationError(refusal) from None
        if not is_transient(exc):
            raise
        log.warning("the database did not answer at start (%r): its schema is not checked", exc)
        return
    finally:
        # Its connection closed now, while the database answers: left in the pool, an API
        # (whose requests use a pool of their own) would close it only at exit, and wait there
        # on a database gone silent since.
        await database.dispose()
    if problem:
        raise ConfigurationError(problem)


# A worker process collects the youngest generation every WORKER_GEN0_THRESHOLD allocations of
# tracked objects instead of Python's 700. A persister's lot makes some 10,000 (each entry, its
# fields, its event, its rows), all freed by reference counting once it lands: collected every
# 700 allocations, each was traversed and aged on the way. Measured by `python -m
# benchmarks.drain` into PostgreSQL: 63 -> 52 µs of CPU per order landed. An API process keeps
# Python's threshold: a request's objects are few and die with it.
WORKER_GEN0_THRESHOLD = 50_000


def settle_heap(*, worker: bool = False) -> None:
    """Leave what a server process has built so far (modules, the app, its schemas: some
    140,000 objects that live as long as it does) out of every later garbage collection; in a
    ``worker`` process, collect young objects less often (``WORKER_GEN0_THRESHOLD``).

    Each full collection walked all of them again; under a stampede the collector took about a
    seventh of the API process's CPU. Called once the process has built its app or workers."""
    gc.collect()
    gc.freeze()
    if worker:
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(WORKER_GEN0_THRESHOLD, older, oldest)
