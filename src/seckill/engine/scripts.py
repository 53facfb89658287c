"""The Lua scripts: read once from the package, loaded into Redis once, called by EVALSHA.

Each item script is ``_common.lua`` followed by its own file. A server that lost its script cache
(a restart, a failover, SCRIPT FLUSH) answers NOSCRIPT; the call then loads the script again and
retries once, which is safe because a NOSCRIPT reply means the script did not run.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum
from importlib.resources import files
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError, ResponseError

from seckill.domain.outcomes import ErrorCode, InvalidRequest

LUA_DIR = files("seckill.engine") / "lua"


class ScriptName(StrEnum):
    LOAD_ITEM = "load_item"
    RESERVE = "reserve"
    CONFIRM = "confirm"
    RELEASE = "release"
    SETTLE_PAYMENT = "settle_payment"
    EXPIRE_DUE = "expire_due"
    REPLAY_HOLDS = "replay_holds"
    RECOUNT = "recount"
    RECOVER = "recover"
    RENEW_LEASE = "renew_lease"
    DROP_LEASE = "drop_lease"


# Scripts over one item's keys share the helpers and the KEYS layout of _common.lua.
ITEM_SCRIPTS = frozenset(
    {ScriptName.LOAD_ITEM, ScriptName.RESERVE, ScriptName.CONFIRM, ScriptName.RELEASE,
     ScriptName.SETTLE_PAYMENT, ScriptName.EXPIRE_DUE, ScriptName.REPLAY_HOLDS,
     ScriptName.RECOUNT, ScriptName.RECOVER}
)  # fmt: skip


def script_text(name: ScriptName) -> str:
    """One script as sent to Redis (an item script starts with the shared helpers)."""
    own = (LUA_DIR / f"{name}.lua").read_text(encoding="utf-8")
    if name not in ITEM_SCRIPTS:
        return own
    return (LUA_DIR / "_common.lua").read_text(encoding="utf-8") + own


@dataclass(frozen=True, slots=True)
class Script:
    name: ScriptName
    source: str
    sha: str


def _refusal(exc: ResponseError) -> InvalidRequest | None:
    """Turn a script's error reply (``code: message``) into InvalidRequest, if it is one of ours."""
    code, sep, message = str(exc).partition(": ")
    if sep and code in ErrorCode._value2member_map_:
        return InvalidRequest(ErrorCode(code), message)
    return None


class Scripts:
    """Every script of the engine, ready to call on one Redis client."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._scripts = {
            name: Script(name, src, hashlib.sha1(src.encode()).hexdigest())
            for name in ScriptName
            for src in [script_text(name)]
        }

    def __getitem__(self, name: ScriptName) -> Script:
        return self._scripts[name]

    async def load(self) -> None:
        """Load every script now, so the first purchase pays no load."""
        for script in self._scripts.values():
            await self._redis.script_load(script.source)

    async def call(self, name: ScriptName, keys: tuple[str, ...], args: tuple[Any, ...]) -> Any:
        script = self._scripts[name]
        try:
            try:
                return await self._redis.evalsha(script.sha, len(keys), *keys, *args)
            except NoScriptError:
                await self._redis.script_load(script.source)
                return await self._redis.evalsha(script.sha, len(keys), *keys, *args)
        except ResponseError as exc:
            refusal = _refusal(exc)
            if refusal is None:
                raise
            raise refusal from None
