"""Running seckill: the API and the workers, together in one process or apart.

``seckill serve`` runs everything on one event loop (the embedded default: one command, one
Redis it owns). In production run ``seckill api`` and ``seckill worker ...`` as separate
processes, as many of each as needed. SIGTERM or SIGINT stops all of it gracefully: the
server stops accepting, finishes the requests in hand, and each worker finishes its pass.

**The drain.** With ``SECKILL_DRAIN_SECONDS`` (5 s under the production profile, none under the
embedded one), SIGTERM first makes an API process unready: ``/readyz`` answers 503 with
``"draining": true`` while every route, ``/livez`` and the purchase included, goes on serving,
so load balancers take the process out of rotation before it stops. Once the drain has run, it
stops as above. SIGINT, or a second SIGTERM, stops at once. Whoever receives the signal runs
the drain, and the flag is ``seckill.api.drain.Drain``:

* ``seckill serve``, and ``seckill api --server uvicorn`` with one process: our own event loop
  takes SIGTERM, begins the process's own drain and sets the stop event once it has run
  (``_stop_on_signals``); workers in the same process keep working through it.
* ``seckill api --server uvicorn --workers N``: uvicorn's supervisor queues the signal and
  handles it in its loop; ``_DrainingMultiprocess.handle_term`` raises the run's flag file and
  sets the supervisor's exit event once the drain has run, which stops the processes as
  before.
* ``seckill api`` under granian: granian's supervisor owns the signals and stops its workers
  (SIGTERM to each) as soon as its handler runs. Its startup hook runs after granian installed
  that handler and before any worker starts, so there ``_drain_on_sigterm`` puts a handler of
  ours in front of it, which raises the flag file and hands the signal on to granian's own
  handler once the drain has run.

Under either supervisor the workers read the flag file the supervisor made for the run
(``Drain.for_processes``), so no signal is sent to a worker that may not be ready for one. The
signal must reach the supervisor alone: a container's pid 1, or systemd's ``KillMode=mixed``
(a worker that gets SIGTERM itself stops at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn
import uvloop
from uvicorn.supervisors.multiprocess import Multiprocess

from seckill.api.drain import Drain
from seckill.api.sockets import listening_socket
from seckill.bootstrap.runtime import open_runtime, settle_heap
from seckill.bootstrap.workers import WorkerKind, build_worker
from seckill.config import Settings
from seckill.observability.logs import configure_logging
from seckill.workers.loop import run_until_stopped, stop_on_signals
from seckill.workers.persister import PersisterConfig

if TYPE_CHECKING:
    from granian.server.common import AbstractServer

    from seckill.api.worker_http import QuietServer

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 60


async def run(
    settings: Settings,
    *,
    api: bool,
    workers: Sequence[WorkerKind],
    persister: PersisterConfig | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT. Everything shares one runtime (connections, order ids).

    With the API, SIGTERM drains first (see the module's docstring). Without it (``seckill
    worker ...``), ``settings.metrics_port`` set, the workers' metrics and liveness are served
    on that port (``seckill.api.worker_http``)."""
    # Bound first, by us rather than uvicorn, so a taken port fails fast as an exception.
    sock = listening_socket(settings.api_host, settings.api_port) if api else None
    scrape_sock = None
    if not api and settings.metrics_port is not None:
        scrape_sock = listening_socket(settings.metrics_host, settings.metrics_port)
    # Signals first: a SIGTERM while connecting still ends in a clean stop.
    stop = asyncio.Event()
    drain = Drain()
    _stop_on_signals(stop, drain, settings.effective_drain_seconds if api else 0.0)
    async with open_runtime(settings) as runtime:
        tasks = []
        for kind in workers:
            worker, idle_pause = build_worker(kind, runtime, stop, persister=persister)
            tasks.append(
                asyncio.create_task(run_until_stopped(worker, stop, idle_pause=idle_pause))
            )
            log.info("%s started", kind)
        servers = []
        if scrape_sock is not None:
            from seckill.api.worker_http import worker_app

            servers.append(_serving(worker_app(), scrape_sock, tasks))
            host, port = scrape_sock.getsockname()[:2]
            log.info("metrics on http://%s:%d/metrics", host, port)
        if sock is not None:
            from seckill.api.app import create_app  # FastAPI and the routes: not a worker's

            app = create_app(settings, runtime=runtime, drain=drain)
            servers.append(_serving(app, sock, tasks))
            host, port = sock.getsockname()[:2]
            log.info("API on http://%s:%d (OpenAPI at /docs)", host, port)
        settle_heap(worker=bool(workers))
        await stop.wait()
        log.info("stopping")
        for server in servers:
            server.should_exit = True
        await asyncio.gather(*tasks)
        log.info("stopped")


def _serving(app: Any, sock: socket.socket, tasks: list[asyncio.Task[None]]) -> QuietServer:
    """uvicorn serving ``app`` on ``sock`` in this loop, its task added to ``tasks``."""
    from seckill.api.lean_http import LeanHttpProtocol
    from seckill.api.worker_http import QuietServer

    config = uvicorn.Config(
        app, http=LeanHttpProtocol, log_level="warning", access_log=False, lifespan="on"
    )
    server = QuietServer(config)
    tasks.append(asyncio.create_task(server.serve(sockets=[sock])))
    return server


def _stop_on_signals(stop: asyncio.Event, drain: Drain, seconds: float) -> None:
    """SIGINT sets ``stop`` at once; SIGTERM too, or, with a drain of ``seconds``, begins
    ``drain`` and sets ``stop`` once it has run (a second SIGTERM meanwhile: at once)."""
    stop_on_signals(stop)
    if seconds <= 0:
        return
    loop = asyncio.get_running_loop()

    def drain_then_stop() -> None:
        if drain.draining:
            stop.set()
            return
        _log_drain(seconds)
        drain.begin()
        loop.call_later(seconds, stop.set)

    loop.add_signal_handler(signal.SIGTERM, drain_then_stop)


def _log_drain(seconds: float) -> None:
    log.info("SIGTERM: draining for %g s (/readyz answers 503), then stopping", seconds)


def _drain_then(drain: Drain, seconds: float, stop: Callable[[], object]) -> None:
    """In a supervisor: raise the run's flag now, call ``stop`` once the drain has run."""
    _log_drain(seconds)
    drain.begin()
    timer = threading.Timer(seconds, stop)
    timer.daemon = True
    timer.start()


class _DrainingMultiprocess(Multiprocess):
    """uvicorn's supervisor, draining on SIGTERM before it stops its processes."""

    def __init__(
        self, config: uvicorn.Config, sockets: list[socket.socket], *, drain: Drain, seconds: float
    ) -> None:
        super().__init__(config, sockets)
        self.drain, self.seconds = drain, seconds

    def handle_term(self) -> None:
        if self.drain.draining:  # a second SIGTERM
            super().handle_term()
        else:
            _drain_then(self.drain, self.seconds, self.should_exit.set)


def _drain_on_sigterm(server: AbstractServer[Any], drain: Drain, seconds: float) -> None:
    """Put the drain in front of granian's SIGTERM handler. Called from granian's startup
    hook: after granian installed its handlers, before it forks a worker."""
    supervisor = os.getpid()
    granians: Callable[..., object] = server.signal_handler_interrupt

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        # A worker forked with this handler, signalled before its own loop took SIGTERM over,
        # is granian's business; so is a second SIGTERM.
        if os.getpid() != supervisor or drain.draining:
            granians(signum, frame)
        else:
            _drain_then(drain, seconds, granians)

    signal.signal(signal.SIGTERM, on_sigterm)


def _drain_for_processes(seconds: float) -> contextlib.AbstractContextManager[Drain | None]:
    """The run's shared drain when there is one to run, else None."""
    return Drain.for_processes() if seconds > 0 else contextlib.nullcontext()


def run_api_processes(settings: Settings, processes: int) -> None:
    """The API in ``processes`` worker processes on one listening socket, until SIGTERM/SIGINT.

    The socket is bound here, once, and handed to each process (uvicorn's supervisor spawns
    them, restarts one that dies and stops them all on a signal). Each process opens its own
    runtime: its own connections and its own leased order-id worker id. They must share one
    Redis, so an embedded one is refused (``seckill serve`` runs that); the schema is prepared
    once here, before any process opens the database. SIGTERM drains first (see the
    module's docstring).
    """
    _require_shared_redis(settings)
    uvloop.run(_prepare_schema(settings))
    from seckill.api.lean_http import LeanHttpProtocol  # the API stack: not a worker's

    sock = listening_socket(settings.api_host, settings.api_port)
    config = uvicorn.Config(
        "seckill.api.app:app_from_environment",
        factory=True,
        workers=processes,
        http=LeanHttpProtocol,
        loop="uvloop",
        log_level="warning",
        access_log=False,
        lifespan="on",
    )
    host, port = sock.getsockname()[:2]
    log.info("API on http://%s:%d (OpenAPI at /docs), %d processes", host, port, processes)
    seconds = settings.effective_drain_seconds
    with _drain_for_processes(seconds) as drain:
        if drain is None:
            Multiprocess(config, sockets=[sock]).run()
        else:
            _DrainingMultiprocess(config, [sock], drain=drain, seconds=seconds).run()


def run_api_granian(settings: Settings, processes: int) -> None:
    """The API under granian in ``processes`` worker processes, until SIGTERM/SIGINT.

    granian's supervisor (this process) forks the workers; each builds the app from the
    environment and opens its own runtime, as under ``run_api_processes``, and with more than
    one they must share a Redis. A worker that dies is respawned; SIGTERM or SIGINT stops them
    all, each after its lifespan's shutdown, and this process exits 0. SIGTERM drains first
    (see the module's docstring).
    """
    if processes > 1:
        _require_shared_redis(settings)
    uvloop.run(_prepare_schema(settings))
    host, port = _bindable(settings.api_host, settings.api_port)
    server = granian_server(
        "seckill.api.app:app_from_environment", factory=True, host=host, port=port,
        processes=processes,
    )  # fmt: skip
    # granian's constructor reconfigures logging with dictConfig, which closes our handler.
    configure_logging(settings.log_format, settings.log_level)
    seconds = settings.effective_drain_seconds
    with _drain_for_processes(seconds) as drain:

        def started() -> None:  # granian's startup hook: its handlers set, no worker started yet
            if drain is not None:
                _drain_on_sigterm(server, drain, seconds)
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


async def _prepare_schema(settings: Settings) -> None:
    """``prepare_schema`` once, before any process opens the database: the embedded SQLite file
    upgraded, another database's schema checked (a refusal stops the supervisor, not each of
    its workers in turn)."""
    from seckill.bootstrap.runtime import prepare_schema
    from seckill.bootstrap.tls import database_ssl_context
    from seckill.store.database import open_database

    database = open_database(settings.effective_database_url, tls=database_ssl_context(settings))
    try:
        await prepare_schema(
            database, embedded=settings.database_url_is_default, currency=settings.currency
        )
    finally:
        await database.dispose()


def run_blocking(settings: Settings, **options: Any) -> None:
    """``run`` on uvloop, the faster event loop (the code is the same on asyncio's)."""
    uvloop.run(run(settings, **options))
