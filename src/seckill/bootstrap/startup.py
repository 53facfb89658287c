"""What a starting server or worker waits for before it builds anything: Redis answering.

Apart from ``runtime`` on purpose: this module imports nothing that imports prometheus_client,
so a process waits (and may refuse, one line) before its metrics directory is made."""

from __future__ import annotations

import asyncio
import logging

from seckill.bootstrap.tls import redis_ssl_options
from seckill.config import Settings
from seckill.domain.masking import mask_in, mask_url
from seckill.engine.cluster import REDIS_FAILED, connect

log = logging.getLogger(__name__)

# The longest pause between two tries of a Redis that does not answer at start.
REDIS_RETRY_MAX_PAUSE_S = 1.0


# What a PING of a Redis that is down, unreachable or silent fails with.
_REDIS_DOWN: tuple[type[Exception], ...] = (*REDIS_FAILED, OSError, TimeoutError)


class RedisUnavailable(Exception):
    """Redis did not answer a starting process within SECKILL_REDIS_START_WAIT_SECONDS; the
    message names the URL (masked) and the last error."""


async def wait_for_redis(settings: Settings) -> None:
    """Return once the Redis of SECKILL_REDIS_URL answers a PING (the embedded one: at once).
    A Redis that does not is tried again, each failure logged, for
    SECKILL_REDIS_START_WAIT_SECONDS; then ``RedisUnavailable``. Each try is bounded too: a
    Redis that accepts and answers nothing counts as down."""
    url = settings.redis_url
    if not url:
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.redis_start_wait_seconds
    pause, tries = 0.1, 0
    redis = connect(
        url,
        cluster=settings.redis_cluster,
        max_connections=2,
        ssl_options=redis_ssl_options(settings),
    )
    try:
        while True:
            tries += 1
            try:
                async with asyncio.timeout(max(deadline - loop.time(), REDIS_RETRY_MAX_PAUSE_S)):
                    await redis.ping()
                return
            except _REDIS_DOWN as exc:
                error = mask_in(str(exc) or type(exc).__name__, url)
                left = deadline - loop.time()
                if left <= 0:
                    raise RedisUnavailable(
                        f"Redis at SECKILL_REDIS_URL ({mask_url(url)}) did not answer in "
                        f"{settings.redis_start_wait_seconds:g} s ({tries} tries; "
                        f"SECKILL_REDIS_START_WAIT_SECONDS): {error}"
                    ) from None
                log.warning(
                    "Redis at %s does not answer (%s): trying again for %.1f s more",
                    mask_url(url), error, left,
                )  # fmt: skip
                await asyncio.sleep(min(pause, left))
                pause = min(2 * pause, REDIS_RETRY_MAX_PAUSE_S)
    finally:
        await redis.aclose()
