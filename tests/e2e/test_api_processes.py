"""`seckill api --workers N`: several processes on one port, one Redis; ids never collide,
metrics add up across them, and SIGTERM stops every one. Under either server; granian, whose
supervisor forks even one worker, with one process too. With SECKILL_METRICS_PORT, /metrics is
served on that port alone (every process sharing it), not on the buyers' port."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest
from redis.asyncio import Redis

from seckill.bootstrap.keys import crowd_credentials
from seckill.config import Settings
from seckill.crowd.client import ApiClient
from seckill.redis_server import RedisServer
from tests.e2e.test_serve import free_port

pytestmark = pytest.mark.redis_variants("redis7")

BUYERS = 40


async def sell(
    url: str, data_dir: Path, processes: int, metrics_url: str
) -> tuple[set[str], set[int], str]:
    """Sell BUYERS units, each over a new connection; the order ids, the API pids seen (until
    ``processes`` of them answered), and the metrics text of one process."""
    credentials = crowd_credentials(Settings(data_dir=data_dir))
    async with aiohttp.ClientSession() as http:
        admin = ApiClient(http, url, credentials)
        now = datetime.now(UTC)
        created = await admin.create_item(
            name="Shared", total=BUYERS, per_buyer_limit=1, hold_seconds=600,
            starts_at=now - timedelta(minutes=1), ends_at=now + timedelta(hours=1),
        )  # fmt: skip
        item_id = created.body["item_id"]
        assert (await admin.warm(item_id)).status == 200

    async def buy(n: int) -> tuple[str, int]:
        connector = aiohttp.TCPConnector(force_close=True)  # a new connection: any process
        async with aiohttp.ClientSession(connector=connector) as http:
            client = ApiClient(http, url, credentials)
            ticket = (await client.ticket(item_id, f"b{n}")).body["ticket"]
            bought = await client.buy(item_id, f"b{n}", ticket=ticket, key="k", quantity=1)
            assert bought.status == 202, bought.body
            seen = await client.request("GET", "/api/v1/admin/dashboard", token=credentials.admin())
            pid = re.search(r"pid (\d+)", seen.body["server"])
            assert pid is not None
            return bought.body["order_id"], int(pid.group(1))

    answers = await asyncio.gather(*(buy(n) for n in range(BUYERS)))
    pids = {pid for _, pid in answers}
    # A process still starting takes no connection yet: ask (new connections) until all did.
    deadline = time.monotonic() + 60
    while len(pids) < processes and time.monotonic() < deadline:
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector) as http:
            seen = await ApiClient(http, url, credentials).request(
                "GET", "/api/v1/admin/dashboard", token=credentials.admin()
            )
        found = re.search(r"pid (\d+)", seen.body["server"])
        assert found is not None
        pids.add(int(found.group(1)))
    async with aiohttp.ClientSession() as http, http.get(f"{metrics_url}/metrics") as scraped:
        assert scraped.status == 200
        metrics = await scraped.text()
    return {order for order, _ in answers}, pids, metrics


def answering(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).close()
    except OSError:  # refused, or an HTTP error (503 until Redis and SQL answer)
        return False
    return True


def api_url(log_path: Path, processes: int) -> str | None:
    """The address from the "API on http://..." line, once it is printed."""
    line = rf"API on (http://\S+) \(OpenAPI at /docs\), {processes} processes"
    found = re.search(line, log_path.read_text())
    return found.group(1) if found else None


@pytest.mark.parametrize(
    ("server", "processes", "metrics_port"),
    [("uvicorn", 2, False), ("granian", 2, True), ("granian", 1, False)],
)
def test_api_processes_share_one_port(
    redis_server: RedisServer,
    redis: Redis,
    tmp_path: Path,
    server: str,
    processes: int,
    metrics_port: bool,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SECKILL_")}
    env |= {"SECKILL_REDIS_URL": redis_server.url, "SECKILL_DATA_DIR": str(tmp_path)}
    metrics_url = None
    if metrics_port:
        port = free_port()
        env["SECKILL_METRICS_PORT"] = str(port)
        metrics_url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "api.log"
    argv = ["api", "--server", server, "--workers", str(processes), "--port", "0"]
    with log_path.open("wb") as log:
        api = subprocess.Popen(
            [sys.executable, "-m", "seckill.cli", *argv], env=env, stdout=log, stderr=log
        )
    pids: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        # Port 0: the line must give the port the kernel picked, where the API then answers.
        while (url := api_url(log_path, processes)) is None or not answering(f"{url}/healthz"):
            assert api.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        assert not url.endswith(":0"), url
        orders, pids, metrics = asyncio.run(sell(url, tmp_path, processes, metrics_url or url))
        if metrics_url is not None:  # off the buyers' port; liveness beside the metrics
            assert not answering(f"{url}/metrics")
            assert answering(f"{metrics_url}/livez")

        assert len(orders) == BUYERS  # a leased worker id per process: no id twice
        assert len(pids) == processes, pids  # every process answered
        assert api.pid not in pids  # granian's and uvicorn's supervisors serve nothing
        reserved = re.search(
            r'seckill_http_requests_total\{outcome="reserved",route="[^"]+/orders"\} (\S+)',
            metrics,
        )
        assert reserved is not None and float(reserved.group(1)) == BUYERS  # summed
    finally:
        api.send_signal(signal.SIGTERM)
        assert api.wait(30) == 0, log_path.read_text()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # every API process stopped with the supervisor
