"""`seckill serve` on embedded defaults: one command brings up Redis, SQLite, the API and the
workers; `seckill token` mints what the API accepts; SIGTERM stops it all cleanly."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env_for(data_dir: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SECKILL_")}
    return env | {
        "SECKILL_DATA_DIR": str(data_dir),
        "SECKILL_API_PORT": str(port),
        "SECKILL_REAPER_INTERVAL_SECONDS": "0.2",
    }


def call(
    method: str, url: str, token: str | None = None, body: Any = None, **headers: str
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    for name, value in headers.items():
        request.add_header(name.replace("_", "-"), value)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def token(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "seckill.cli", "token", *args],
        capture_output=True, text=True, env=env, timeout=30, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def wait_until_serving(server: subprocess.Popen[Any], base: str, log_path: Path) -> None:
    """Until the ``seckill serve`` at ``base`` answers /healthz 200; its log fails the test if
    it exits first or takes over 30 s."""
    deadline = time.monotonic() + 30
    while True:
        try:
            if call("GET", f"{base}/healthz")[0] == 200:
                return
        except OSError:
            pass
        assert server.poll() is None, log_path.read_text()
        assert time.monotonic() < deadline, "serve did not come up in 30 s"
        time.sleep(0.1)


def test_serve_sells_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    env = env_for(tmp_path, port)
    base = f"http://127.0.0.1:{port}"
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "seckill.cli", "serve"], env=env, stdout=log, stderr=log
    )
    try:
        wait_until_serving(server, base, tmp_path / "serve.log")
        admin, alice = token(env, "--admin"), token(env, "--buyer", "alice")
        now = datetime.now(UTC)
        status, item = call(
            "POST", f"{base}/api/v1/admin/items", admin,
            {"name": "Lamp", "price_cents": 2500, "total": 2, "hold_seconds": 1,
             "starts_at": (now - timedelta(minutes=1)).isoformat(),
             "ends_at": (now + timedelta(hours=1)).isoformat()},
        )  # fmt: skip
        assert status == 201, item
        item_id = item["item_id"]
        assert call("POST", f"{base}/api/v1/admin/items/{item_id}/warm", admin)[0] == 200
        status, ticket = call("POST", f"{base}/api/v1/items/{item_id}/tickets", alice)
        assert status == 200, ticket
        status, order = call(
            "POST", f"{base}/api/v1/items/{item_id}/orders", alice, {},
            Idempotency_Key="k", Seckill_Ticket=ticket["ticket"],
        )  # fmt: skip
        assert status == 202, order
        assert call("GET", f"{base}/api/v1/admin/items/{item_id}", alice)[0] == 403

        # The reaper releases the unpaid hold, and the persister lands it all in SQL.
        deadline = time.monotonic() + 20
        while True:
            status, counters = call("GET", f"{base}/api/v1/admin/items/{item_id}", admin)
            if counters["agree"] and counters["redis"]["available"] == 2:
                break
            assert time.monotonic() < deadline, counters
            time.sleep(0.2)
        status, seen = call(
            "GET", f"{base}/api/v1/items/{item_id}/orders/{order['order_id']}", alice
        )
        assert (status, seen["status"], seen["release_reason"]) == (200, "released", "expired")
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=20)
        log.close()
    output = (tmp_path / "serve.log").read_text()
    assert code == 0, output
    assert "stopped" in output
    assert "Traceback" not in output


def test_token_needs_exactly_one_subject(tmp_path: Path) -> None:
    env = env_for(tmp_path, free_port())
    for args in ([], ["--admin", "--buyer", "x"]):
        done = subprocess.run(
            [sys.executable, "-m", "seckill.cli", "token", *args],
            capture_output=True, text=True, env=env, timeout=30,
        )  # fmt: skip
        assert done.returncode == 2
        assert "exactly one" in done.stdout
