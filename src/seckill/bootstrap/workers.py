"""Each background worker, built from a Runtime (``seckill worker <kind>``, or ``seckill serve``
with the API)."""

from __future__ import annotations

import asyncio
from enum import StrEnum

from seckill.bootstrap.runtime import Runtime
from seckill.bootstrap.services import archivist, reconciler
from seckill.engine.queues import Queues
from seckill.sinks import sink_from_url
from seckill.workers.archiver import Archiver
from seckill.workers.bridge import Bridge
from seckill.workers.inlet import Inlet
from seckill.workers.loop import Worker
from seckill.workers.persister import Persister, PersisterConfig
from seckill.workers.reaper import Reaper
from seckill.workers.reconciler import ReconcilerWorker


class WorkerKind(StrEnum):
    PERSISTER = "persister"
    REAPER = "reaper"
    RECONCILER = "reconciler"
    INLET = "inlet"
    BRIDGE = "bridge"
    ARCHIVER = "archiver"


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
            engine=runtime.engine,
        )
        return worker, 0.0  # its read blocks in Redis instead
    if kind is WorkerKind.RECONCILER:
        settings = runtime.settings
        reconciling = ReconcilerWorker(
            reconciler=reconciler(runtime),
            redis=runtime.redis,
            scripts=runtime.engine.scripts,
            prefix=prefix,
            interval_s=settings.reconcile_interval_seconds,
            repair=settings.reconcile_repair,
            engine=runtime.engine,
        )
        return reconciling, settings.fence_check_seconds
    if kind is WorkerKind.BRIDGE:
        if not runtime.settings.bridge_url:
            raise ValueError("the bridge needs a broker: set SECKILL_BRIDGE_URL (or --to)")
        bridge = Bridge(
            redis=runtime.redis,
            ledger=runtime.ledger,  # it publishes only what SQL has landed
            sink=sink_from_url(runtime.settings.bridge_url),
            prefix=prefix,
            stop=stop,
        )
        return bridge, 0.0  # its read blocks in Redis instead
    if kind is WorkerKind.INLET:
        settings = runtime.settings
        inlet = Inlet(
            queues=Queues(runtime.engine),
            redis=runtime.redis,
            scripts=runtime.engine.scripts,
            prefix=prefix,
            interval_s=settings.queue_inlet_interval_seconds,
            rate=settings.queue_admit_per_second,
            per_unit=settings.queue_admit_per_unit,
            turn_ms=settings.queue_turn_seconds * 1000,
            stop=stop,
        )
        return inlet, settings.queue_inlet_interval_seconds
    if kind is WorkerKind.ARCHIVER:
        return Archiver(archivist=archivist(runtime)), runtime.settings.archive_interval_seconds
    reaper = Reaper(engine=runtime.engine)
    return reaper, runtime.settings.reaper_interval_seconds
