"""The README's main job: a live flash sale on embedded defaults, over HTTP.

``seckill serve`` (the API, persister, reaper and reconciler) starts in a child process on a
free port with a throwaway data directory: its own embedded redis-server and SQLite file, unless
SECKILL_REDIS_URL / SECKILL_DATABASE_URL say otherwise; with ``redis_cluster`` masters, a local
Redis Cluster (``seckill.redis_cluster``) started for the demo. The crowd (``seckill.crowd``) then
rushes it through HTTP exactly as ``seckill bench`` rushes a real deployment, and audits what
it left, reading SQL directly as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console

from seckill.config import Settings
from seckill.crowd.client import Credentials
from seckill.crowd.plan import CrowdPlan
from seckill.crowd.rehearsal import rehearse
from seckill.redis_cluster import LocalCluster

STARTUP_LIMIT_S = 60
STOP_LIMIT_S = 30
_LISTENING = re.compile(r"API on (http://\S+) ")


class ServerFailed(RuntimeError):
    """The demo's server did not start; the message carries the end of its log."""


def run_demo(
    plan: CrowdPlan, *, report_dir: Path, console: Console, redis_cluster: int = 0
) -> bool:
    """Serve on a throwaway data directory, rush it with ``plan``'s crowd, audit what it left;
    True if every verdict passes. Raises ServerFailed if the server did not start.

    ``redis_cluster``: that many masters (a replica each) of a local Redis Cluster, instead of
    the embedded Redis."""
    # The demo's data directory is throwaway: it never touches the real one.
    with (
        tempfile.TemporaryDirectory(prefix="seckill-demo-") as scratch,
        contextlib.ExitStack() as stack,
    ):
        settings = demo_settings(Path(scratch))
        redis_env: dict[str, str] = {}
        if redis_cluster:
            with console.status(f"starting a Redis Cluster of {redis_cluster} masters"):
                cluster = stack.enter_context(
                    LocalCluster(
                        masters=redis_cluster, replicas=1, binary=settings.redis_server_bin or None
                    )
                )
            console.print(f"Redis Cluster up: {redis_cluster} masters, a replica each")
            redis_env = {"SECKILL_REDIS_URL": cluster.url, "SECKILL_REDIS_CLUSTER": "true"}
        with console.status("starting seckill serve: API, persister, reaper, reconciler"):
            url = stack.enter_context(serving(settings.data_dir, redis_env))
        console.print(f"seckill serve is up on {url}; the crowd rushes in")
        credentials = Credentials.from_settings(settings)
        rehearsal = rehearse(
            url, plan, credentials, kind="demo", console=console,
            database_url=settings.effective_database_url, report_dir=report_dir,
        )  # fmt: skip
        return asyncio.run(rehearsal).result["passed"]


def demo_settings(data_dir: Path) -> Settings:
    """The settings the demo's server runs with, as the crowd must know them (its secrets are
    generated into ``data_dir`` by whichever process asks first)."""
    return Settings(data_dir=data_dir)


@contextlib.contextmanager
def serving(data_dir: Path, redis_env: dict[str, str] | None = None) -> Iterator[str]:
    """``seckill serve`` in a child process until exit; yields its base URL. ``redis_env``
    names a Redis other than the embedded one."""
    log_path = data_dir / "serve.log"
    env = {
        **os.environ,
        **(redis_env or {}),
        "SECKILL_DATA_DIR": str(data_dir),
        "SECKILL_API_HOST": "127.0.0.1",
        "SECKILL_API_PORT": "0",  # a free port; the server logs which
        "SECKILL_REAPER_INTERVAL_SECONDS": os.environ.get("SECKILL_REAPER_INTERVAL_SECONDS", "0.2"),
    }
    with log_path.open("wb") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "seckill.cli", "serve"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C in the terminal reaches it through us, once
        )
    try:
        yield _wait_listening(child, log_path)
    finally:
        _stop(child)


def _wait_listening(child: subprocess.Popen[bytes], log_path: Path) -> str:
    give_up = time.monotonic() + STARTUP_LIMIT_S
    while time.monotonic() < give_up:
        found = _LISTENING.search(log_path.read_text(errors="replace"))
        if found:
            return found.group(1)
        if child.poll() is not None:
            break
        time.sleep(0.05)
    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
    raise ServerFailed(f"seckill serve did not start (exit {child.poll()}):\n{tail}")


def _stop(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)  # finishes the batch in hand, stops its Redis
        try:
            child.wait(STOP_LIMIT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
