"""Fixtures of the integration suites that talk to a broker (see ``tests.support.brokers``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from seckill.sinks import Sink
from seckill.sinks.base import redact_url
from tests.support.brokers import BROKER_URLS, BROKERS, TESTED_BROKERS, Broker


@pytest.fixture(params=TESTED_BROKERS)
async def broker(request: pytest.FixtureRequest) -> AsyncIterator[Broker]:
    name = request.param
    try:
        async with asyncio.timeout(10):
            connected: Broker = await BROKERS[name]()
    except Exception as exc:  # what a missing broker raises differs by client
        pytest.fail(f"{name} at {redact_url(BROKER_URLS[name])} unreachable ({exc!r}): start it")
    yield connected
    await connected.cleanup()


@pytest.fixture
async def sinks() -> AsyncIterator[list[Sink]]:
    """Sinks to close at the end, whatever the test did."""
    opened: list[Sink] = []
    yield opened
    for sink in opened:
        await sink.close()
