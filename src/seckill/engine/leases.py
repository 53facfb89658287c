"""The one owner-token lease: a Redis key that at most one process holds at a time.

Taking it is ``SET key token NX PX ttl`` with a fresh random token; renewing (renew_lease.lua)
and dropping (drop_lease.lua) compare that token first, so a process only ever extends or
deletes a lease it still owns. Order-id worker ids, the reconciler's pass and an item card's
load are each guarded by one.
"""

from __future__ import annotations

import secrets
import time

from seckill.engine.cluster import RedisClient
from seckill.engine.scripts import ScriptName, Scripts


class Lease:
    """One key, held by at most one owner at a time, for ``ttl_ms`` after each renewal.

    The owner is whoever's token the key holds: this object once ``acquire()`` said True, until
    the lease lapses or ``drop()`` ends it. Nothing renews it in the background: a holder that
    does not renew within ``ttl_ms`` (paused, partitioned, dead) loses it, and another process
    may take it the moment it lapses. A late ``renew()`` then answers False and changes nothing,
    and a later ``drop()`` leaves the new owner's lease alone. So the holder must stop relying on
    the lease before it could lapse, not when a renewal fails.
    """

    def __init__(self, redis: RedisClient, *, scripts: Scripts, key: str, ttl_ms: int) -> None:
        self._redis = redis
        self._scripts = scripts
        self._ttl_ms = ttl_ms
        self._token: str | None = None
        self._held_at = 0.0  # time.monotonic() when the last take or renewal was sent
        self.key = key

    async def acquire(self) -> bool:
        """Take the lease if nobody holds it (ourselves included); False if it is held."""
        token = secrets.token_hex(16)
        sent_at = time.monotonic()
        if not await self._redis.set(self.key, token, nx=True, px=self._ttl_ms):
            return False
        self._token, self._held_at = token, sent_at
        return True

    async def renew(self) -> bool:
        """Hold the lease ``ttl_ms`` more from now, if it is still ours; False if it is not."""
        if self._token is None:
            return False
        sent_at = time.monotonic()
        renewed = bool(
            await self._scripts.call(
                ScriptName.RENEW_LEASE, (self.key,), (self._token, self._ttl_ms)
            )
        )
        if renewed:
            self._held_at = sent_at
        return renewed

    async def hold(self) -> bool:
        """Keep the lease if it is ours, else take it if nobody holds it; False if another does.
        Ours, it is renewed only once a third of ``ttl_ms`` has passed since it was last sent
        for (it holds till at least ``ttl_ms`` after that): a holder called every fraction of
        a second sends a command a second, and has two thirds of the lease left to stop in."""
        if self._token is not None:
            if time.monotonic() - self._held_at < self._ttl_ms / 3000:
                return True
            if await self.renew():
                return True
        return await self.acquire()

    async def drop(self) -> None:
        """End the lease now if it is still ours (another owner's is left alone)."""
        if self._token is None:
            return
        await self._scripts.call(ScriptName.DROP_LEASE, (self.key,), (self._token,))
        self._token = None
