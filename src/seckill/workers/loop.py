"""The one loop every worker runs in: call ``run_once()`` until told to stop.

A failing pass is logged and retried after a growing pause (capped), so a worker outlives a
Redis or database outage instead of dying or spinning. Stopping waits for the pass in hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Protocol

log = logging.getLogger(__name__)

# The longest pause between two tries of something failing (a sink down, a pass that raised):
# long enough not to hammer what is down, short enough to notice it is back.
RETRY_PAUSE_MAX_S = 5.0


class Worker(Protocol):
    name: str

    async def run_once(self) -> int:
        """Do one pass of work; return how much was done (0 = idle)."""
        ...


async def run_until_stopped(
    worker: Worker,
    stop: asyncio.Event,
    *,
    idle_pause: float = 0.0,
    max_backoff: float = RETRY_PAUSE_MAX_S,
) -> None:
    backoff = 0.1
    while not stop.is_set():
        try:
            done = await worker.run_once()
            backoff = 0.1
            if not done and idle_pause:
                await _sleep_unless_stopped(stop, idle_pause)
        except Exception:
            log.exception("%s: pass failed; retrying in %.1f s", worker.name, backoff)
            await _sleep_unless_stopped(stop, backoff)
            backoff = min(backoff * 2, max_backoff)


async def _sleep_unless_stopped(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


def stop_on_signals(stop: asyncio.Event) -> None:
    """SIGTERM and SIGINT set ``stop``: the pass in hand finishes, then the worker exits."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
