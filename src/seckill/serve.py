"""Running seckill: the API and the workers, together in one process or apart.

``seckill serve`` runs everything on one event loop (the embedded default: one command, one
Redis it owns). In production run ``seckill api`` and ``seckill worker ...`` as separate
processes, as many of each as needed. SIGTERM or SIGINT stops all of it gracefully: the
server stops accepting, finishes the requests in hand, and each worker finishes its pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator, Sequence
from enum import StrEnum
from typing import Any

import uvicorn
import uvloop

from seckill.bootstrap import Runtime, open_runtime
from seckill.config import Settings
from seckill.reconcile.reconciler import Reconciler
from seckill.workers.loop import Worker, run_until_stopped, stop_on_signals
from seckill.workers.persister import Persister, PersisterConfig
from seckill.workers.reaper import Reaper
from seckill.workers.reconciler import ReconcilerWorker

log = logging.getLogger(__name__)


class WorkerKind(StrEnum):
    PERSISTER = "persister"
    REAPER = "reaper"
    RECONCILER = "reconciler"


def build_worker(
    kind: WorkerKind,
    runtime: Runtime,
    stop: asyncio.Event,
    *,
    persister: PersisterConfig | None = None,
) -> tuple[Worker, float]:
    """A worker and the pause it takes when a pass found nothing to do."""
    prefix = runtime.settings.key_prefix
    if kind is WorkerKind.PERSISTER:
        worker = Persister(
            redis=runtime.redis,
            ledger=runtime.ledger,
            prefix=prefix,
            config=persister or PersisterConfig(),
            stop=stop,
        )
        return worker, 0.0  # its read blocks in Redis instead
    if kind is WorkerKind.RECONCILER:
        settings = runtime.settings
        reconciler = ReconcilerWorker(
            reconciler=Reconciler(
                runtime.engine,
                runtime.ledger,
                grace_ms=int(settings.reconcile_grace_seconds * 1000),
            ),
            redis=runtime.redis,
            prefix=prefix,
            interval_s=settings.reconcile_interval_seconds,
            repair=settings.reconcile_repair,
        )
        return reconciler, settings.reconcile_interval_seconds
    reaper = Reaper(redis=runtime.redis, engine=runtime.engine, prefix=prefix)
    return reaper, runtime.settings.reaper_interval_seconds


def listening_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket that says it is TCP (proto IPPROTO_TCP): asyncio turns Nagle off
    only on such sockets, and with it on every response waits ~40 ms for a delayed ACK."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


class _Server(uvicorn.Server):
    """uvicorn, minus its own signal handling: the stop event below owns SIGTERM and SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def run(
    settings: Settings,
    *,
    api: bool,
    workers: Sequence[WorkerKind],
    persister: PersisterConfig | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT. Everything shares one runtime (connections, order ids)."""
    from seckill.api.app import create_app

    # Bound first, by us rather than uvicorn, so a taken port fails fast as an exception.
    sock = listening_socket(settings.api_host, settings.api_port) if api else None
    # Signals first: a SIGTERM while connecting still ends in a clean stop.
    stop = asyncio.Event()
    stop_on_signals(stop)
    async with open_runtime(settings) as runtime:
        tasks = []
        for kind in workers:
            worker, idle_pause = build_worker(kind, runtime, stop, persister=persister)
            tasks.append(
                asyncio.create_task(run_until_stopped(worker, stop, idle_pause=idle_pause))
            )
            log.info("%s started", kind)
        server = None
        if sock is not None:
            config = uvicorn.Config(
                create_app(settings, runtime=runtime),
                log_level="warning",
                access_log=False,
                lifespan="on",
            )
            server = _Server(config)
            tasks.append(asyncio.create_task(server.serve(sockets=[sock])))
            host, port = sock.getsockname()[:2]
            log.info("API on http://%s:%d (OpenAPI at /docs)", host, port)
        await stop.wait()
        log.info("stopping")
        if server is not None:
            server.should_exit = True
        await asyncio.gather(*tasks)
        log.info("stopped")


def run_api_processes(settings: Settings, processes: int) -> None:
    """The API in ``processes`` worker processes on one listening socket, until SIGTERM/SIGINT.

    The socket is bound here, once, and handed to each process (uvicorn's supervisor spawns
    them, restarts one that dies and stops them all on a signal). Each process opens its own
    runtime: its own connections and its own leased order-id worker id. They must share one
    Redis, so an embedded one is refused (``seckill serve`` runs that); the embedded SQLite
    file is upgraded once here, before any process opens it.
    """
    from uvicorn.supervisors import Multiprocess

    if not settings.redis_url:
        raise ValueError(
            "several API processes share one Redis: set SECKILL_REDIS_URL "
            "(the embedded Redis belongs to one process: `seckill serve`)"
        )
    if settings.database_url_is_default:
        uvloop.run(_upgrade_embedded_database(settings))
    sock = listening_socket(settings.api_host, settings.api_port)
    config = uvicorn.Config(
        "seckill.api.app:app_from_environment",
        factory=True,
        workers=processes,
        loop="uvloop",
        log_level="warning",
        access_log=False,
        lifespan="on",
    )
    host, port = sock.getsockname()[:2]
    log.info("API on http://%s:%d (OpenAPI at /docs), %d processes", host, port, processes)
    Multiprocess(config, sockets=[sock]).run()


async def _upgrade_embedded_database(settings: Settings) -> None:
    from seckill.store.database import open_database
    from seckill.store.migrate import upgrade

    database = open_database(settings.effective_database_url)
    try:
        await upgrade(database)
    finally:
        await database.dispose()


def run_blocking(settings: Settings, **options: Any) -> None:
    """``run`` on uvloop, the faster event loop (the code is the same on asyncio's)."""
    uvloop.run(run(settings, **options))
