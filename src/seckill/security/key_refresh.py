"""Keeping a token codec's key set current: loaded again in the background every
``SECKILL_JWT_JWKS_REFRESH_SECONDS``, and early when a token names a key the set lacks, so an
identity provider can publish a new key, sign with it and retire the old one without a restart.
A load that fails keeps the last good set (``seckill.security.jwks`` reads a set)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

import httpx

from seckill.security.jwks import JwksSource
from seckill.security.tokens import TokenCodec

log = logging.getLogger(__name__)

# A token naming a key not in the set may be the first signed with a key just published: it asks
# for a load ahead of schedule, at most once in this long, so a stream of made-up kids costs the
# provider one request per period and nothing more.
EARLY_REFRESH_SECONDS = 30.0


class JwksRefresher:
    """Loads a codec's key set again every ``interval_seconds``, and early (at most once per
    ``early_seconds``) when a token names a key the set lacks."""

    def __init__(
        self,
        *,
        codec: TokenCodec,
        source: JwksSource,
        interval_seconds: float,
        early_seconds: float = EARLY_REFRESH_SECONDS,
    ) -> None:
        self.codec = codec
        self.source = source
        self.interval_seconds = interval_seconds
        self.early_seconds = early_seconds
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_early = -early_seconds

    def request_early(self) -> None:
        """Ask for a load now, unless one was asked for less than ``early_seconds`` ago. Cheap,
        and safe from any thread."""
        now = time.monotonic()
        if self._loop is None or now - self._last_early < self.early_seconds:
            return
        self._last_early = now
        self._loop.call_soon_threadsafe(self._wake.set)

    async def refresh(self, client: httpx.AsyncClient) -> bool:
        """Load the set once and hand it to the codec; False (and a warning) if that failed,
        the codec keeping the keys it had."""
        try:
            table = await self.source.aload(client)
        except ValueError as error:
            log.warning("token keys not refreshed, the last good set stays: %s", error)
            return False
        except Exception:
            # Whatever a document does to the parser, the refresher goes on.
            log.exception("token keys not refreshed, the last good set stays")
            return False
        if self.codec.use_keys(table):
            log.info("token keys changed (%s): now %s", self.source.setting, ", ".join(table))
        return True

    async def run(self) -> None:
        """Refresh until cancelled."""
        self._loop = asyncio.get_running_loop()
        self.codec.on_unknown_key = self.request_early
        try:
            async with httpx.AsyncClient(follow_redirects=True) as client:
                while True:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.interval_seconds):
                            await self._wake.wait()
                    self._wake.clear()
                    await self.refresh(client)
        finally:
            self.codec.on_unknown_key = None


@contextlib.asynccontextmanager
async def refreshing(
    codec: TokenCodec, source: JwksSource | None, *, interval_seconds: float
) -> AsyncIterator[JwksRefresher | None]:
    """While open, ``codec``'s key set is loaded again from ``source`` in the background (with
    no source, this does nothing and yields None)."""
    if source is None:
        yield None
        return
    refresher = JwksRefresher(codec=codec, source=source, interval_seconds=interval_seconds)
    task = asyncio.create_task(refresher.run(), name="jwks-refresher")
    try:
        yield refresher
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
