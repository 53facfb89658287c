"""`seckill worker <kind> --metrics-port N`: the worker serves its own metrics and its liveness
on that port (the flag over SECKILL_METRICS_PORT), and still stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from seckill.redis_server import RedisServer
from tests.api.test_metrics import parse, value
from tests.e2e.test_serve import free_port

pytestmark = pytest.mark.redis_variants("redis7")


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return answer.status, answer.read().decode()


def test_a_worker_serves_its_metrics_and_liveness(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SECKILL_")}
    env |= {
        "SECKILL_REDIS_URL": redis_server.url,
        "SECKILL_DATA_DIR": str(tmp_path),
        "SECKILL_METRICS_PORT": str(free_port()),  # the flag wins
    }
    log = tmp_path / "reaper.log"
    argv = ["worker", "reaper", "--interval", "0.05", "--metrics-port", str(port)]
    started = time.time()
    with log.open("wb") as out:
        reaper = subprocess.Popen(
            [sys.executable, "-m", "seckill.cli", *argv], env=env, stdout=out, stderr=out
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                status, body = get(f"{base}/metrics")
                last_pass = value(parse(body), "seckill_reaper_last_pass_timestamp_seconds")
                if status == 200 and last_pass >= started:
                    break
            except OSError:
                pass
            assert reaper.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        assert get(f"{base}/livez") == (200, '{"status":"alive"}')
    finally:
        reaper.send_signal(signal.SIGTERM)
        code = reaper.wait(20)
    output = log.read_text()
    assert code == 0, output
    assert f"metrics on http://127.0.0.1:{port}/metrics" in output
    assert "Traceback" not in output, output
