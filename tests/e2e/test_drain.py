"""SIGTERM drains `seckill api` before it stops, under each way it runs: granian's supervisor,
uvicorn in the one process, and uvicorn's supervisor of several. During the drain /readyz
answers 503 (draining) while /livez and purchases, on new connections too, answer as before;
purchases sent as the signal goes all complete; then the process exits 0."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from seckill.bootstrap.keys import crowd_credentials
from seckill.config import Settings
from seckill.crowd.client import ApiClient
from seckill.engine.engine import RedisEngine
from seckill.redis_server import RedisServer
from seckill.security.tickets import TICKET_HEADER
from tests.support.polling import wait_until

pytestmark = pytest.mark.redis_variants("redis7")

DRAIN_S = 2.0  # long beside the few requests made in it; the test never waits it out itself
IN_FLIGHT = 10
_LISTENING = re.compile(r"API on (http://\S+) ")


async def started(api: asyncio.subprocess.Process, log: Path) -> str:
    """The API's address once it answers /readyz 200."""
    url = ""

    async def ready() -> bool:
        nonlocal url
        text = await asyncio.to_thread(log.read_text, errors="replace")
        assert api.returncode is None, text
        found = _LISTENING.search(text)
        if found is None:
            return False
        url = found.group(1)
        try:
            return (await fresh(url, "GET", "/readyz"))[0] == 200
        except aiohttp.ClientError:  # printed as granian starts, answering a moment later
            return False

    await wait_until(ready, 60, "the API ready")
    return url


async def fresh(
    url: str, method: str, path: str, *, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    """One request on a new connection, as a load balancer's next client would make it: the
    status and the JSON body."""
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http,
        http.request(method, url + path, headers=headers) as answer,
    ):
        return answer.status, await answer.json()


@pytest.mark.parametrize(("server", "processes"), [("granian", 1), ("uvicorn", 1), ("uvicorn", 2)])
async def test_sigterm_drains_then_stops(
    redis_server: RedisServer,
    engine: RedisEngine,
    tmp_path: Path,
    server: str,
    processes: int,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SECKILL_")}
    env |= {
        "SECKILL_REDIS_URL": redis_server.url,
        "SECKILL_DATA_DIR": str(tmp_path),
        "SECKILL_DRAIN_SECONDS": str(DRAIN_S),
    }
    log = tmp_path / "api.log"
    argv = ["api", "--server", server, "--workers", str(processes), "--port", "0"]
    with log.open("wb") as out:
        api = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "seckill.cli", *argv, env=env, stdout=out, stderr=out
        )
    try:
        url = await started(api, log)
        credentials = crowd_credentials(Settings(data_dir=tmp_path))
        async with aiohttp.ClientSession() as http:
            client = ApiClient(http, url, credentials)
            now = datetime.now(UTC)
            created = await client.create_item(
                name="Drained", total=100, per_buyer_limit=1, hold_seconds=600,
                starts_at=now - timedelta(minutes=1), ends_at=now + timedelta(hours=1),
            )  # fmt: skip
            item_id = created.body["item_id"]
            assert (await client.warm(item_id)).status == 200
            buyers = [f"b{n}" for n in range(IN_FLIGHT + 1)]
            tickets = {b: (await client.ticket(item_id, b)).body["ticket"] for b in buyers}

        def buy(buyer: str) -> asyncio.Task[tuple[int, Any]]:
            path = f"/api/v1/items/{item_id}/orders"
            headers = {
                "Authorization": f"Bearer {credentials.buyer(buyer)}",
                "Idempotency-Key": "k",
                TICKET_HEADER: tickets[buyer],
            }
            return asyncio.create_task(fresh(url, "POST", path, headers=headers))

        in_flight = [buy(b) for b in buyers[:IN_FLIGHT]]
        await asyncio.sleep(0)  # each connecting as the signal goes
        api.send_signal(signal.SIGTERM)

        async def unready() -> bool:
            return (await fresh(url, "GET", "/readyz"))[0] == 503

        await wait_until(unready, 10, "/readyz 503 after SIGTERM")
        status, ready = await fresh(url, "GET", "/readyz")
        assert (status, ready["draining"], ready["redis"]) == (503, True, "ok")
        assert await fresh(url, "GET", "/livez") == (200, {"status": "alive"})
        assert (await buy(buyers[-1]))[0] == 202  # a new connection, still served

        assert [(await task)[0] for task in in_flight] == [202] * IN_FLIGHT
        code = await asyncio.wait_for(api.wait(), 30)
        assert code == 0, await asyncio.to_thread(log.read_text)
    finally:
        if api.returncode is None:
            api.kill()
            await api.wait()
    stock = await engine.stock(item_id)
    assert stock is not None and stock.held == IN_FLIGHT + 1  # every 202 holds its unit
    output = await asyncio.to_thread(log.read_text)
    assert "draining" in output and "Traceback" not in output, output
