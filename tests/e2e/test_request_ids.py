"""One request id follows a purchase: the API's answer, the stream, the persister's log line and
the order's SQL row; logs are JSON lines when configured."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp

from seckill.bootstrap.keys import crowd_credentials
from seckill.config import Settings
from seckill.crowd.client import ApiClient
from seckill.security.tickets import TICKET_HEADER
from tests.e2e.test_serve import free_port


def log_lines(path: Path) -> list[dict[str, Any]]:
    lines = []
    for text in path.read_text().splitlines():
        if text.startswith("{"):
            lines.append(json.loads(text))  # every line a JSON object: a bad one fails here
    return lines


async def purchase(url: str, data_dir: Path, headers: dict[str, str]) -> aiohttp.ClientResponse:
    credentials = crowd_credentials(Settings(data_dir=data_dir))
    async with aiohttp.ClientSession() as http:
        client = ApiClient(http, url, credentials)
        now = datetime.now(UTC)
        created = await client.create_item(
            name="Traced", total=5, per_buyer_limit=1, hold_seconds=60,
            starts_at=now - timedelta(minutes=1), ends_at=now + timedelta(hours=1),
        )  # fmt: skip
        item_id = created.body["item_id"]
        assert (await client.warm(item_id)).status == 200
        ticket = (await client.ticket(item_id, "alice")).body["ticket"]
        async with http.post(
            f"{url}/api/v1/items/{item_id}/orders",
            json={"quantity": 1},
            headers={
                "Authorization": f"Bearer {credentials.buyer('alice')}",
                "Idempotency-Key": "k1",
                TICKET_HEADER: ticket,
                **headers,
            },
        ) as answer:
            await answer.read()
            return answer


def test_a_purchase_carries_its_request_id_from_api_to_sql_row(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SECKILL_")}
    env |= {
        "SECKILL_DATA_DIR": str(tmp_path),
        "SECKILL_API_PORT": str(port),
        "SECKILL_LOG_FORMAT": "json",
    }
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "seckill.cli", "serve"], env=env, stdout=log, stderr=log
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while "API on" not in log_path.read_text() and time.monotonic() < deadline:
            assert server.poll() is None, log_path.read_text()
            time.sleep(0.05)
        traced = asyncio.run(purchase(url, tmp_path, {"X-Request-Id": "trace-42"}))
        assert traced.status == 202
        assert traced.headers["X-Request-Id"] == "trace-42"

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            landed = [m for m in log_lines(log_path) if "landed in SQL" in m["message"]]
            if landed:
                break
            time.sleep(0.1)
        lines = log_lines(log_path)
        # The API's own line of the hold is DEBUG: at INFO the landing is the order's one line.
        assert [m for m in lines if m["logger"] == "seckill.services.purchases"] == []
        # The persister's line names each order landed with its request id.
        [landing] = landed
        assert landing["logger"] == "seckill.workers.persister"
        assert landing["message"].startswith("orders landed in SQL (order=request): ")
        order_id = int(landing["message"].rsplit(" ", 1)[1].removesuffix("=trace-42"))
        with sqlite3.connect(tmp_path / "seckill.db") as db:
            rows = db.execute("SELECT id, request_id FROM orders").fetchall()
        assert rows == [(order_id, "trace-42")]

        # No usable id given (none, or one unsafe to log): a new one, answered in the header.
        for given in ({}, {"X-Request-Id": "bad id\twith spaces"}):
            answer = asyncio.run(purchase(url, tmp_path, given))
            fresh = answer.headers["X-Request-Id"]
            assert len(fresh) == 16 and int(fresh, 16) >= 0
    finally:
        server.terminate()
        server.wait(30)
