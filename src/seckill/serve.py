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
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import uvicorn
import uvloop

from seckill.bootstrap.runtime import open_runtime, settle_heap
from seckill.bootstrap.workers import WorkerKind, build_worker
from seckill.config import Settings
from seckill.observability.logs import configure_logging
from seckill.workers.loop import run_until_stopped, stop_on_signals
from seckill.workers.persister import PersisterConfig

if TYPE_CHECKING:
    from granian.server.common import AbstractServer

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 60


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
            settle_heap()
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

    _require_shared_redis(settings)
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


def run_api_granian(settings: Settings, processes: int) -> None:
    """The API under granian in ``processes`` worker processes, until SIGTERM/SIGINT.

    granian's supervisor (this process) forks the workers; each builds the app from the
    environment and opens its own runtime, as under ``run_api_processes``, and with more than
    one they must share a Redis. A worker that dies is respawned; SIGTERM or SIGINT stops them
    all, each after its lifespan's shutdown, and this process exits 0.
    """
    if processes > 1:
        _require_shared_redis(settings)
    if settings.database_url_is_default:
        uvloop.run(_upgrade_embedded_database(settings))
    host, port = _bindable(settings.api_host, settings.api_port)
    server = granian_server(
        "seckill.api.app:app_from_environment", factory=True, host=host, port=port,
        processes=processes,
    )  # fmt: skip
    # granian's constructor reconfigures logging with dictConfig, which closes our handler.
    configure_logging(settings.log_format, settings.log_level)

    def started() -> None:  # granian's startup hook: the workers are starting, not yet listening
        threading.Thread(target=_announce, args=(host, port, processes), daemon=True).start()

    server.on_startup(started)
    server.on_shutdown(lambda: log.info("stopped"))  # once every worker has
    server.serve()


def granian_server(
    target: str, *, factory: bool, host: str, port: int, processes: int
) -> AbstractServer[Any]:
    """granian as ``seckill api`` runs it, serving the ASGI app ``target`` ("module:name",
    called first if ``factory``) on ``host`` (an IP address) and ``port``; ``serve()`` runs it.

    Each worker process binds its own SO_REUSEPORT listener (the kernel spreads connections
    over them) and runs the app on a uvloop event loop, its lifespan on."""
    from granian import Granian
    from granian.constants import Interfaces, Loops
    from granian.log import LogLevels

    return Granian(
        target,
        address=host,
        port=port,
        interface=Interfaces.ASGI,  # with lifespan: each worker opens and closes its runtime
        factory=factory,
        workers=processes,
        loop=Loops.uvloop,
        backlog=2048,  # as listening_socket's; each worker then takes 2048/N requests at once
        log_level=LogLevels.warning,
        log_access=False,
        respawn_failed_workers=True,  # as uvicorn's supervisor does
    )


def _announce(host: str, port: int, processes: int) -> None:
    """Log "API on ..." once a worker accepts connections: callers take it as "connect now"."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=1).close()
        except OSError:
            time.sleep(0.02)
            continue
        log.info("API on http://%s:%d (OpenAPI at /docs), %d processes", host, port, processes)
        return
    log.error("the API did not listen on %s:%d within %d s", host, port, STARTUP_TIMEOUT_S)


def _bindable(host: str, port: int) -> tuple[str, int]:
    """The address granian is to listen on: ``host`` as an IP address (granian takes no name),
    and port 0 as the free port the kernel picked. Bound here, without SO_REUSEPORT, so a taken
    port fails now, as an OSError: granian's own listeners have SO_REUSEPORT and would quietly
    share a port with another of them, and its errors are RuntimeErrors with a Rust backtrace.
    The probe is closed before granian binds: another process could take a port 0 picked here
    in between (granian then fails to bind), but never can a wrong port be printed."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
        address, bound = probe.getsockname()[:2]
    return str(address), int(bound)


def _require_shared_redis(settings: Settings) -> None:
    if not settings.redis_url:
        raise ValueError(
            "several API processes share one Redis: set SECKILL_REDIS_URL "
            "(the embedded Redis belongs to one process: `seckill serve`)"
        )


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
