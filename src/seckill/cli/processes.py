"""Commands that run the product: the API and the workers, each until SIGTERM."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterable
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import typer

from seckill.cli.common import (
    abort,
    console,
    current_settings,
    overridden,
    setting_default,
    start_process,
)

if TYPE_CHECKING:
    from seckill.config import Settings

commands = typer.Typer()
worker_commands = typer.Typer(help="Background workers.", no_args_is_help=True)


def _run(settings: Settings, *, api: bool, workers: Iterable[str], **options: Any) -> None:
    """Run the API and/or workers on one event loop until SIGTERM (after ``_start_process``)."""
    from seckill.bootstrap.workers import WorkerKind
    from seckill.domain.configuration import ConfigurationError
    from seckill.domain.masking import mask_in
    from seckill.engine.cluster import REDIS_UNAVAILABLE
    from seckill.serve import run_blocking

    try:
        run_blocking(settings, api=api, workers=[WorkerKind(w) for w in workers], **options)
    except (OSError, ConfigurationError) as exc:
        abort(exc)
    except REDIS_UNAVAILABLE as exc:  # gone again after start_process found it answering
        abort(f"Redis did not answer: {mask_in(str(exc), settings.redis_url)}")


_HOST = typer.Option(None, help=f"Listen address ({setting_default('api_host')}).")
_PORT = typer.Option(None, min=0, max=65535, help=f"Port ({setting_default('api_port')}).")
_METRICS_PORT = typer.Option(
    None,
    "--metrics-port",
    min=0,
    max=65535,
    help="Serve /metrics and /livez on this port, at SECKILL_METRICS_HOST "
    f"({setting_default('metrics_port')}: no listener).",
)


@commands.command()
def serve(host: str | None = _HOST, port: int | None = _PORT) -> None:
    """Run the API and all workers (persister, reaper, reconciler, archiver, the inlet, the
    bridge with SECKILL_BRIDGE_URL) in one process until SIGTERM."""
    settings = overridden(start_process(), api_host=host, api_port=port)
    bridge = ("bridge",) if settings.bridge_url else ()
    # The inlet always: any item may have been created with a waiting room, and with no queue
    # joined a pass costs it one read.
    workers = ("persister", "reaper", "reconciler", "archiver", "inlet", *bridge)
    _run(settings, api=True, workers=workers)


class ApiServer(StrEnum):
    GRANIAN = "granian"
    UVICORN = "uvicorn"


_SERVER = typer.Option(
    None,
    "--server",
    help=f"What serves the API ({setting_default('api_server')}: the faster floor in "
    "benchmarks/http.py; figures in docs/benchmarks.md).",
)


@commands.command()
def api(
    host: str | None = _HOST,
    port: int | None = _PORT,
    processes: int = typer.Option(
        1, "--workers", min=1, help="API processes sharing the port (more than 1: a shared Redis)."
    ),
    server: ApiServer | None = _SERVER,
) -> None:
    """Run the API alone until SIGTERM (workers run apart: `seckill worker ...`)."""
    settings = overridden(start_process(processes=processes), api_host=host, api_port=port)
    chosen = ApiServer(server or settings.api_server)
    if chosen is ApiServer.UVICORN and processes == 1:
        _run(settings, api=True, workers=())
        return
    from seckill.serve import run_api_granian, run_api_processes

    run = run_api_granian if chosen is ApiServer.GRANIAN else run_api_processes
    try:
        run(settings, processes)
    except (OSError, ValueError) as exc:
        abort(exc)


@worker_commands.command("persister")
def worker_persister(
    batch_size: int | None = typer.Option(
        None, min=1, max=10_000, help="Entries landed per transaction (default: the persister's)."
    ),
    claim_idle_ms: int | None = typer.Option(
        None, min=10, help="Take over entries idle this long (default: the persister's)."
    ),
    max_deliveries: int | None = typer.Option(
        None, min=1, help="Deliveries before a dead letter (default: the persister's)."
    ),
    metrics_port: int | None = _METRICS_PORT,
) -> None:
    """Land every item stream's events in the database until SIGTERM."""
    settings = overridden(start_process(), metrics_port=metrics_port)
    # PersisterConfig is the one home of these defaults; its module imports prometheus_client,
    # so it is read only now, after _start_process.
    from seckill.workers.persister import PersisterConfig

    flags = dict(batch_size=batch_size, claim_idle_ms=claim_idle_ms, max_deliveries=max_deliveries)
    config = PersisterConfig(**{k: v for k, v in flags.items() if v is not None})
    _run(settings, api=False, workers=("persister",), persister=config)


@worker_commands.command("reaper")
def worker_reaper(
    interval: float | None = typer.Option(
        None,
        min=0.01,
        help=f"Seconds between passes ({setting_default('reaper_interval_seconds')}).",
    ),
    metrics_port: int | None = _METRICS_PORT,
) -> None:
    """Release holds past their deadline, every interval, until SIGTERM (replicas are safe)."""
    settings = overridden(
        start_process(), reaper_interval_seconds=interval, metrics_port=metrics_port
    )
    _run(settings, api=False, workers=("reaper",))


@worker_commands.command("reconciler")
def worker_reconciler(
    interval: float | None = typer.Option(
        None,
        min=0.01,
        help=f"Seconds between passes ({setting_default('reconcile_interval_seconds')}).",
    ),
    repair: bool | None = typer.Option(
        None,
        "--repair/--report-only",
        help=f"Repair what is found ({setting_default('reconcile_repair')}).",
    ),
    metrics_port: int | None = _METRICS_PORT,
) -> None:
    """Compare every item's Redis and SQL records each interval, until SIGTERM.

    Logs the drift found and, with --repair, repairs it. Replicas are safe: one holds the
    upkeep lock and works.
    """
    settings = overridden(
        start_process(),
        reconcile_interval_seconds=interval,
        reconcile_repair=repair,
        metrics_port=metrics_port,
    )
    _run(settings, api=False, workers=("reconciler",))


@worker_commands.command("archiver")
def worker_archiver(
    interval: float | None = typer.Option(
        None,
        min=0.01,
        help=f"Seconds between passes ({setting_default('archive_interval_seconds')}).",
    ),
    grace: float | None = typer.Option(
        None,
        min=0,
        help="Seconds after its sale ended that a settled item is archived "
        f"({setting_default('archive_grace_seconds')}).",
    ),
    metrics_port: int | None = _METRICS_PORT,
) -> None:
    """Archive settled items each interval, until SIGTERM: their keys leave Redis, SQL keeps
    them. Replicas are safe: each item is archived under its own upkeep lease."""
    settings = overridden(
        start_process(),
        archive_interval_seconds=interval,
        archive_grace_seconds=grace,
        metrics_port=metrics_port,
    )
    _run(settings, api=False, workers=("archiver",))


@worker_commands.command("inlet")
def worker_inlet(
    interval: float | None = typer.Option(
        None,
        min=0.01,
        help=f"Seconds between steps ({setting_default('queue_inlet_interval_seconds')}).",
    ),
    metrics_port: int | None = _METRICS_PORT,
) -> None:
    """Let the next buyers of every waiting room in, each interval, until SIGTERM.

    The pace is SECKILL_QUEUE_ADMIT_PER_SECOND and SECKILL_QUEUE_ADMIT_PER_UNIT. Replicas are
    safe: one holds the upkeep lock and steps.
    """
    settings = overridden(
        start_process(), queue_inlet_interval_seconds=interval, metrics_port=metrics_port
    )
    _run(settings, api=False, workers=("inlet",))


@worker_commands.command("bridge")
def worker_bridge(
    to: str | None = typer.Option(
        None,
        "--to",
        help="The broker: amqp://user:pass@host:5672/ (RabbitMQ) or nats://host:4222 (NATS "
        "JetStream); default SECKILL_BRIDGE_URL.",
    ),
    metrics_port: int | None = _METRICS_PORT,
) -> None:
    """Forward every order event to a broker until SIGTERM, acknowledging each in its stream
    only once the broker confirmed it. Replicas are safe: they share the bridge's group."""
    settings = overridden(start_process(), bridge_url=to, metrics_port=metrics_port)
    if not settings.bridge_url:
        abort(ValueError("name the broker: --to amqp://... or nats://... (or SECKILL_BRIDGE_URL)"))
    try:
        from seckill.sinks import sink_from_url

        sink_from_url(settings.bridge_url)
    except ValueError as exc:
        abort(exc)
    _run(settings, api=False, workers=("bridge",))


@commands.command("dev-cluster")
def dev_cluster(
    masters: int = typer.Option(3, min=1, max=16, help="Primaries; the slots are split evenly."),
    replicas: int = typer.Option(1, min=0, max=4, help="Replicas of each primary."),
    node_timeout_ms: int = typer.Option(
        2_000, min=100, help="How long a primary may be unreachable before a replica takes over."
    ),
) -> None:
    """Run a Redis Cluster on loopback ports until Ctrl-C or SIGTERM, for trying things on one.

    The nodes run the redis-server of SECKILL_REDIS_SERVER_BIN (default: the one on the PATH,
    else the bundled 6.2) and keep nothing once stopped.
    """
    from seckill.redis_cluster import LocalCluster
    from seckill.redis_server import RedisServerError

    binary = current_settings().redis_server_bin or None
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    cluster = LocalCluster(
        masters=masters, replicas=replicas, binary=binary, node_timeout_ms=node_timeout_ms
    )
    try:
        with cluster:
            primaries = ", ".join(map(str, cluster.primary_ports()))
            console.print(
                f"Redis Cluster up: {masters} primaries (ports {primaries}), {replicas} replica(s)"
                f" each; point seckill at it with\n"
                f"SECKILL_REDIS_URL={cluster.url} SECKILL_REDIS_CLUSTER=true",
                soft_wrap=True,  # the settings line stays one line to copy
                highlight=False,
            )
            stop.wait()
    except RedisServerError as exc:
        abort(exc)
