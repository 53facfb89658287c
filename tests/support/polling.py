"""Waiting for something that happens in the background (a worker, a server), with a limit."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest


async def wait_until(check: Callable[[], Awaitable[bool]], limit_s: float, what: str) -> None:
    deadline = time.monotonic() + limit_s
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {limit_s} s")
        await asyncio.sleep(0.05)
