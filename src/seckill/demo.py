"""The README's main job: a live flash sale on embedded defaults, over HTTP.

``seckill serve`` (the API, persister, reaper and reconciler) starts in a child process on a
free port with a throwaway data directory: its own embedded redis-server and SQLite file, unless
SECKILL_REDIS_URL / SECKILL_DATABASE_URL say otherwise; with ``redis_cluster`` masters, a local
Redis Cluster (``seckill.redis_cluster``) started for the demo. The crowd (``seckill.crowd``) then
rushes it through HTTP exactly as ``seckill bench`` rushes a real deployment, and audits what
it left, reading SQL directly as well. With ``waiting_room`` the crowd's item is created with a
waiting room of its own (its pace from ``queue_pace``, the deployment's queue settings from
``waiting_room_env``) and the crowd queues in it first; with ``direct_item`` as well, a second
crowd buys a second item without one, at the same time, in the same deployment, and both are
judged. With ``bridge_url`` it runs the bridge
to that broker too, and a consumer of the broker checks every order event arrived
(``seckill.crowd.deliveries``). Once every verdict passes, the operator ends the sale and
archives each item on the console (``seckill.crowd.closing``), a screenshot of it kept beside
the reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import math
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, cast

from rich.console import Console

from seckill.bootstrap.keys import crowd_credentials
from seckill.config import Settings
from seckill.crowd.browser import browser_missing
from seckill.crowd.client import ApiClient, Credentials
from seckill.crowd.closing import ClosingFailed, archive_on_console
from seckill.crowd.plan import CrowdPlan, QueuePlan
from seckill.crowd.rehearsal import Rehearsal, rehearse, session
from seckill.redis_cluster import LocalCluster

STARTUP_LIMIT_S = 60
STOP_LIMIT_S = 30
_LISTENING = re.compile(r"API on (http://\S+) ")
SERVE_LOG = "serve.log"  # in the demo's data directory
_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d [\d:,]+ ([A-Z]+) ")  # a record's first line
COMPLAINTS_SHOWN = 40  # lines
QUEUE_PER_UNIT = 2  # positions let in per unit available within a turn
QUEUE_FRONT_S = 0.5  # how old a poll's answer may be; the crowd's sold-out bound uses it


class ServerFailed(RuntimeError):
    """The demo's server did not start; the message carries the end of its log."""


def run_demo(
    plan: CrowdPlan,
    *,
    report_dir: Path,
    console: Console,
    redis_cluster: int = 0,
    waiting_room: bool = False,
    direct_item: bool = False,
    bridge_url: str | None = None,
) -> bool:
    """Serve on a throwaway data directory, rush it with ``plan``'s crowd, audit what it left;
    True if every verdict passes. Raises ServerFailed if the server did not start.

    ``redis_cluster``: that many masters (a replica each) of a local Redis Cluster, instead of
    the embedded Redis. ``waiting_room``: the crowd's item has one and the crowd queues first.
    ``direct_item`` (with ``waiting_room``): another crowd of the same plan buys another item,
    which has none, meanwhile; True only if the verdicts of both pass.
    ``bridge_url``: the server runs the bridge to that broker, and a consumer of the broker's
    default topology checks that the sale's order events all arrived."""
    # The broker may hold an earlier demo's messages, for an item with the same id.
    started_ms = time.time_ns() // 1_000_000
    # The demo's data directory is throwaway: it never touches the real one.
    with (
        tempfile.TemporaryDirectory(prefix="seckill-demo-") as scratch,
        contextlib.ExitStack() as stack,
    ):
        settings = demo_settings(Path(scratch))
        queue = None
        if waiting_room:
            queue = QueuePlan(front_s=QUEUE_FRONT_S, admit_per_second=queue_pace(plan))
        server_env = waiting_room_env(plan) if waiting_room else {}
        binary = settings.redis_server_bin or None
        if redis_cluster:
            with console.status(f"starting a Redis Cluster of {redis_cluster} masters"):
                cluster = stack.enter_context(
                    LocalCluster(masters=redis_cluster, replicas=1, binary=binary)
                )
            console.print(f"Redis Cluster up: {redis_cluster} masters, a replica each")
            server_env |= {"SECKILL_REDIS_URL": cluster.url, "SECKILL_REDIS_CLUSTER": "true"}
        prefix = settings.key_prefix
        if bridge_url:
            # The broker is shared: a prefix of this run's own keeps its message ids (the stream
            # key and entry id) and bodies apart from another demo's, even one running now.
            prefix = f"demo-{secrets.token_hex(4)}"
            server_env |= {"SECKILL_BRIDGE_URL": bridge_url, "SECKILL_KEY_PREFIX": prefix}
        workers = "persister, reaper, reconciler" + (", bridge" if bridge_url else "")
        with console.status(f"starting seckill serve: API, {workers}"):
            url = stack.enter_context(serving(settings.data_dir, server_env))
        console.print(f"seckill serve is up on {url}; the crowd rushes in")
        credentials = crowd_credentials(settings)
        rehearsal = rehearse(
            url, plan, credentials, kind="demo", console=console,
            database_url=settings.effective_database_url, report_dir=report_dir, queue=queue,
            bridge_url=bridge_url, since_ms=started_ms, prefix=prefix,
        )  # fmt: skip
        if queue is not None and direct_item:
            # One live view at a time: the direct sale's is written aside and shown after.
            aside = Console(file=io.StringIO(), width=console.width, force_terminal=False)
            direct = rehearse(
                url, plan, credentials, kind="demo", console=aside,
                database_url=settings.effective_database_url, report_dir=report_dir,
                since_ms=started_ms, prefix=prefix,
            )  # fmt: skip
            rehearsals = asyncio.run(_together(rehearsal, direct))
            console.print("The item without a waiting room, sold meanwhile:", style="bold")
            console.print(cast(io.StringIO, aside.file).getvalue(), markup=False, end="")
        else:
            rehearsals = [asyncio.run(rehearsal)]
        passed = all(r.result["passed"] for r in rehearsals)
        if passed:
            passed = close_on_console(url, credentials, rehearsals, console)
        if not passed:  # what the server said may tell why
            console.print("The server's warnings and errors:", style="bold")
            console.print(server_complaints(settings.data_dir / SERVE_LOG), markup=False)
        return passed


def close_on_console(
    url: str, credentials: Credentials, rehearsals: list[Rehearsal], console: Console
) -> bool:
    """The operator's last act (``seckill.crowd.closing``): each item's sale ended and archived
    on the console, its screenshot beside the first report. True unless an item could not be;
    skipped, with why, where no browser is."""
    missing = browser_missing()
    if missing:
        console.print(f"The console's last act (archiving on /admin) is skipped: {missing}.")
        return True
    item_ids = [r.sale.item_id for r in rehearsals]
    report = rehearsals[0].html_path
    screenshot = report.with_name(f"{report.stem}-console.png") if report else Path("console.png")

    async def act() -> None:
        async with session(4) as http:
            await archive_on_console(ApiClient(http, url, credentials), item_ids, screenshot)

    with console.status("ending the sale and archiving it on the console"):
        try:
            asyncio.run(act())
        except ClosingFailed as exc:
            console.print(f"[red]The console's last act failed[/]: {exc}")
            return False
    items = ", ".join(map(str, item_ids))
    console.print(f"Sale ended and item {items} archived on the console: {screenshot}")
    return True


async def _together(*rehearsals: Coroutine[Any, Any, Rehearsal]) -> list[Rehearsal]:
    return list(await asyncio.gather(*rehearsals))


def waiting_room_env(plan: CrowdPlan) -> dict[str, str]:
    """The demo server's queue settings, for ``plan``: a turn as long as a hold, so a unit that
    comes back is offered down the line about when it does; two admissions per unit within a
    turn. The server's default stays: no waiting room for an item that does not ask for one."""
    return {
        "SECKILL_QUEUE_ADMIT_PER_UNIT": str(QUEUE_PER_UNIT),
        "SECKILL_QUEUE_TURN_SECONDS": str(plan.hold_seconds),
        "SECKILL_QUEUE_FRONT_SECONDS": str(QUEUE_FRONT_S),
    }


def queue_pace(plan: CrowdPlan) -> int:
    """The demo item's own pace: one turn's worth let in over the turn, so the line moves
    steadily (for seconds, with the default crowd) instead of in one jump per turn."""
    return max(1, math.ceil(QUEUE_PER_UNIT * plan.units / plan.hold_seconds))


def demo_settings(data_dir: Path) -> Settings:
    """The settings the demo's server runs with, as the crowd must know them (its secrets are
    generated into ``data_dir`` by whichever process asks first)."""
    return Settings(data_dir=data_dir)


@contextlib.contextmanager
def serving(data_dir: Path, server_env: dict[str, str] | None = None) -> Iterator[str]:
    """``seckill serve`` in a child process until exit; yields its base URL. ``server_env``
    adds settings: a Redis other than the embedded one, a waiting room."""
    log_path = data_dir / SERVE_LOG
    env = {
        **os.environ,
        **(server_env or {}),
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


def server_complaints(log_path: Path) -> str:
    """The last lines of the server's log records above INFO (tracebacks included)."""
    loud, quiet = [], False
    for line in log_path.read_text(errors="replace").splitlines():
        record = _LOG_LINE.match(line)
        if record:  # else a record's next line (a traceback): as loud as its first
            quiet = record.group(1) in ("DEBUG", "INFO")
        if not quiet:
            loud.append(line)
    return "\n".join(loud[-COMPLAINTS_SHOWN:]) or "(none)"


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
