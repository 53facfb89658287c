"""What the benchmarks share: servers on free ports, the product's client, buyers, CPU figures.

A benchmark is a thin script over this module: it parses its arguments, says what it measures
and prints its figures, the last line one JSON object. Everything it starts here (redis-server,
``seckill serve``/``api``/``worker``, the baselines' uvicorn, a hello app) listens on a free
loopback port and is stopped when its block ends, also on an error or Ctrl-C. The API is driven
through the product's own client, ``seckill.crowd.client``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import uvloop
from sqlalchemy.engine import make_url

from seckill.bootstrap.keys import token_codec
from seckill.config import Settings
from seckill.crowd.client import ApiClient, Credentials, Reply
from seckill.redis_server import RedisServer, bundled_redis_server, die_with_parent

ROOT = Path(__file__).resolve().parent.parent  # the project: ``benchmarks`` is a package in it
# Fixed secrets: the servers and the client must agree, and nothing here is worth protecting.
JWT_SECRET = "seckill-bench-jwt-secret-" + "j" * 32
JWT_ISSUER, JWT_AUDIENCE = "seckill", "seckill-api"
PAYMENT_SECRET = "seckill-bench-payment-secret-" + "p" * 32
TICKET_SECRET = "seckill-bench-ticket-secret-" + "t" * 32
TICKET_TTL_S = 3 * 3600  # tickets are fetched before the clock and outlive the run
HOLD_SECONDS = 3600  # no hold expires during a run: an audit sees every order held
STARTUP_TIMEOUT_S = 60
STOP_TIMEOUT_S = 20

# -- ports and binaries --------------------------------------------------------------------------

Measure = Callable[[RedisServer, argparse.Namespace], Coroutine[Any, Any, dict[str, Any]]]


def run_on_private_redis(measure: Measure, args: argparse.Namespace) -> None:
    """Start a throwaway redis-server, measure, and print the figures as the last line."""
    with RedisServer(binary=redis_binary(args.redis_server), port=free_port()) as server:
        result = asyncio.run(measure(server, args))
    print(json.dumps(result))


def redis_binary(given: str | None) -> Path:
    """The redis-server asked for, else the one on PATH, else the bundled 6.2."""
    found = given or shutil.which("redis-server")
    return Path(found) if found else bundled_redis_server()


def free_port() -> int:
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port != 6379:  # never the machine's own Redis, not even by chance
            return port


def durable_redis(binary: str | None, data_dir: Path) -> RedisServer:
    """A redis-server as the product runs it: AOF on, ``appendfsync everysec``."""
    return RedisServer(
        binary=redis_binary(binary), data_dir=data_dir, port=free_port(), appendonly=True
    )


# -- processes we own ----------------------------------------------------------------------------


def child_env(settings: Mapping[str, object]) -> dict[str, str]:
    """This environment minus every SECKILL_* variable, plus ``settings``: the servers see
    exactly what the benchmark sets (and, run from a temporary directory, no ``.env``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SECKILL_")}
    env.update({f"SECKILL_{k.upper()}": str(v) for k, v in settings.items()})
    # The benchmarks' own modules (``python -m benchmarks.baselines``) from any directory.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


@contextlib.contextmanager
def running(
    argv: Sequence[str], *, env: dict[str, str], cwd: Path, log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """A child process, stopped with SIGTERM (SIGKILL if it lingers) however the block ends."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )  # fmt: skip
        try:
            yield process
        finally:
            stop(process)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(STOP_TIMEOUT_S)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        process.kill()
        process.wait()


def log_tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"


@contextlib.contextmanager
def serving(
    argv: Sequence[str], *, port: int, env: dict[str, str], cwd: Path, log: Path,
    path: str = "/healthz",
) -> Iterator[subprocess.Popen[bytes]]:  # fmt: skip
    """A server started with ``argv``, once it answers ``path`` on ``port``; stopped at the end."""
    with running(argv, env=env, cwd=cwd, log=log) as process:
        uvloop.run(wait_answering(f"http://127.0.0.1:{port}", path, process, log))
        yield process


async def wait_answering(url: str, path: str, process: subprocess.Popen[bytes], log: Path) -> None:
    """Until ``url + path`` answers anything but a server error; exits if the server died."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    async with aiohttp.ClientSession() as http:
        client = ApiClient(http, url, credentials())
        while True:
            if process.poll() is not None:
                sys.exit(f"the server exited at start ({process.returncode}):\n{log_tail(log)}")
            if 0 < (await client.request("GET", path)).status < 500:
                return
            if time.monotonic() > deadline:
                sys.exit(f"no answer from {url}{path} in {STARTUP_TIMEOUT_S} s:\n{log_tail(log)}")
            await asyncio.sleep(0.1)


def seckill_command(*args: str) -> list[str]:
    """``seckill ARGS...``: the CLI installed beside this Python."""
    return [str(Path(sys.executable).with_name("seckill")), *args]


def upgrade_database(env: dict[str, str], cwd: Path) -> None:
    """``seckill db upgrade`` with the servers' settings; exits if it fails."""
    done = subprocess.run(seckill_command("db", "upgrade"), env=env, cwd=cwd, capture_output=True)
    if done.returncode != 0:
        sys.exit(f"seckill db upgrade failed:\n{done.stdout.decode()}{done.stderr.decode()}")


# -- settings and credentials --------------------------------------------------------------------


def server_settings(data_dir: Path) -> dict[str, object]:
    """What every server is told: fixed token, payment and ticket secrets."""
    return {
        "data_dir": data_dir,
        "jwt_algorithm": "HS256",
        "jwt_secret": JWT_SECRET,
        "jwt_issuer": JWT_ISSUER,
        "jwt_audience": JWT_AUDIENCE,
        "payment_secret": PAYMENT_SECRET,
        "ticket_secret": TICKET_SECRET,
    }


def seckill_settings(
    data_dir: Path, *, redis_url: str, database_url: str, concurrency: int
) -> dict[str, object]:
    """The product's settings for a run of ``concurrency`` connections on its own stores."""
    return server_settings(data_dir) | {
        "redis_url": redis_url,
        "database_url": database_url,
        "ticket_ttl_seconds": TICKET_TTL_S,
        "redis_max_connections": max(64, concurrency),
    }


def credentials() -> Credentials:
    """Buyer and admin tokens the servers accept (minted here, with the fixed secret)."""
    settings = Settings(
        _env_file=None, jwt_algorithm="HS256", jwt_secret=JWT_SECRET, jwt_issuer=JWT_ISSUER,
        jwt_audience=JWT_AUDIENCE,
    )  # fmt: skip
    return Credentials(tokens=token_codec(settings), payment_secret=PAYMENT_SECRET)


def session(
    concurrency: int, *, keepalive_s: float = 2, timeout_s: float = 60
) -> aiohttp.ClientSession:
    """One aiohttp session of ``concurrency`` keep-alive connections."""
    # Idle connections are dropped before uvicorn's keep-alive (5 s) closes them under us.
    connector = aiohttp.TCPConnector(limit=concurrency, keepalive_timeout=keepalive_s)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(timeout_s))


@contextlib.asynccontextmanager
async def api(
    url: str, who: Credentials, concurrency: int, *, keepalive_s: float = 2, timeout_s: float = 60
) -> AsyncIterator[ApiClient]:
    """The product's client of the API at ``url``, over one session."""
    async with session(concurrency, keepalive_s=keepalive_s, timeout_s=timeout_s) as http:
        yield ApiClient(http, url, who)


def status_key(reply: Reply) -> str:
    """How a benchmark counts an answer: ``202``, ``409 sold_out``, ``error transport_error``."""
    if reply.status == 0:
        return f"error {reply.outcome}"
    if reply.status < 300:
        return str(reply.status)
    return f"{reply.status} {reply.body.get('error', '?')}"


# -- items and buyers ----------------------------------------------------------------------------


async def create_item(client: ApiClient, *, total: int) -> int:
    """An item on sale now, one unit per buyer, created and warmed through the admin routes."""
    now = datetime.now(UTC)
    made = await client.create_item(
        name="compare", total=total, per_buyer_limit=1, hold_seconds=HOLD_SECONDS,
        starts_at=now - timedelta(minutes=1), ends_at=now + timedelta(hours=2), price_cents=100,
    )  # fmt: skip
    if made.status != 201:
        sys.exit(f"creating an item failed: {made.status} {made.body}")
    item_id = int(made.body["item_id"])
    warmed = await client.warm(item_id)
    if warmed.status != 200:
        sys.exit(f"warming item {item_id} failed: {warmed.status} {warmed.body}")
    return item_id


@dataclass(slots=True)
class Buyer:
    """One buyer of a crowd: the name its token is minted for, its key, its ticket."""

    name: str
    key: str
    repeats: bool = False  # sends its purchase again with the same key
    ticket: str = ""  # for seckill, fetched before the clock starts


def make_crowd(who: Credentials, prefix: str, count: int, repeat_share: float = 0.0) -> list[Buyer]:
    """``count`` buyers, their tokens minted now; ``repeat_share`` of them, evenly spread, send
    their purchase twice."""
    crowd = [
        Buyer(
            name=f"{prefix}{i}",
            key=f"key-{prefix}{i}",
            repeats=int((i + 1) * repeat_share) > int(i * repeat_share),
        )
        for i in range(count)
    ]
    for buyer in crowd:
        who.buyer(buyer.name)  # minted before any clock starts
    return crowd


async def fetch_tickets(
    client: ApiClient, item_id: int, buyers: Sequence[Buyer], concurrency: int
) -> None:
    """Every buyer's purchase ticket for ``item_id``, ``concurrency`` at a time.

    For a sold-out item too: a process that has just seen it sold out refuses tickets (409
    ``sold_out``) until its flag runs out (``SECKILL_SOLD_OUT_RECHECK_MS``), so such a refusal
    is asked again a moment later; nobody buys meanwhile, so the flag does run out."""
    turns = iter(buyers)

    async def connection() -> None:
        for buyer in turns:
            reply = await client.ticket(item_id, buyer.name)
            while reply.status == 409 and reply.outcome == "sold_out":
                await asyncio.sleep(0.1)
                reply = await client.ticket(item_id, buyer.name)
            if reply.status != 200:
                sys.exit(f"no ticket for {buyer.name}: {reply.status} {reply.body}")
            buyer.ticket = reply.body["ticket"]

    async with asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(connection())


async def drained(client: ApiClient, item_id: int, timeout_s: float) -> None:
    """Until the item's stream has landed in SQL and both records agree."""
    deadline = time.monotonic() + timeout_s
    while True:
        reply = await client.counters(item_id)
        if reply.status == 200 and reply.body["backlog"] == 0 and reply.body["agree"]:
            return
        if time.monotonic() > deadline:
            sys.exit(f"the stream did not drain in {timeout_s} s: {reply.status} {reply.body}")
        await asyncio.sleep(0.2)


def percentile(ordered: Sequence[float], share: float) -> float | None:
    """The value below which ``share`` of ``ordered`` (ascending) lies, to 0.1; None if empty."""
    if not ordered:
        return None
    return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))], 1)


# -- CPU accounting ------------------------------------------------------------------------------


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU so far of a process and its live descendants (the worker processes
    of a supervisor), from Linux /proc; 0 if unknown."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return own + sum(cpu_seconds(child) for child in child_pids(pid))


def child_pids(pid: int) -> list[int]:
    """A live process's children (of every thread), from Linux /proc; [] if it is gone."""
    try:
        return [
            int(child)
            for task in Path(f"/proc/{pid}/task").iterdir()
            for child in (task / "children").read_text().split()
        ]
    except OSError:
        return []


def process_tree(pid: int) -> list[int]:
    """A process and its live descendants."""
    return [pid, *(found for child in child_pids(pid) for found in process_tree(child))]


@contextlib.contextmanager
def perf_recorded(name: str, pid: int, directory: Path) -> Iterator[None]:
    """``perf record`` of the CPU process ``pid`` and its children spend (kernel, native code
    and the interpreter alike) over the block: ``<directory>/<name>.data``, for ``perf
    report``."""
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / f"{name.replace(' ', '-')}.data"
    pids = ",".join(map(str, process_tree(pid)))
    argv = ["perf", "record", "-F", "999", "-g", "-p", pids, "-o", str(out)]
    with (directory / "perf.log").open("a") as log:
        perf = subprocess.Popen(argv, stdout=log, stderr=log)
    try:
        yield
    finally:
        perf.send_signal(signal.SIGINT)
        perf.wait(timeout=60)


def py_spy() -> Path | None:
    """py-spy, on the PATH or beside this Python (installed in its virtualenv)."""
    found = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    return Path(found) if found else None


@contextlib.contextmanager
def profiled(name: str, pid: int | None, args: argparse.Namespace) -> Iterator[None]:
    """py-spy (``--profile``) or perf (``--perf``) sampling process ``pid`` (the server, or the
    benchmark itself), with its child processes, over the block, if asked."""
    if pid is not None and args.perf is not None:
        with perf_recorded(name, pid, args.perf):
            yield
        return
    if args.profile is None or pid is None:
        yield
        return
    args.profile.mkdir(parents=True, exist_ok=True)
    out = args.profile / f"{name.replace(' ', '-')}.txt"
    argv = [str(py_spy()), "record", "--pid", str(pid), "--subprocesses", "--format", "raw"]
    argv += ["--rate", "250", "--output", str(out)]
    # C and Rust frames too (the server's own, uvloop, hiredis) need each sample taken with the
    # process paused; Python frames alone are read while it runs.
    argv.append("--native" if args.native else "--nonblocking")
    with (args.profile / "py-spy.log").open("a") as log:
        spy = subprocess.Popen(argv, stdout=log, stderr=log)
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes what it has on SIGINT
        spy.wait(timeout=30)


def _waited_children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


@contextlib.contextmanager
def cpu_spent(
    pids: Mapping[str, int | None], *, own: str | None = None, children: str | None = None
) -> Iterator[dict[str, float]]:
    """CPU seconds each process of ``pids`` spent over the block, filled in when it ends; with
    ``own``, this process's under that name; with ``children``, those of the child processes
    this one waited for in the block (wrk, a generator's pool)."""
    spent: dict[str, float] = {}
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    own_before, children_before = time.process_time(), _waited_children_cpu()
    yield spent
    spent.update({name: cpu_seconds(pid) - before[name] for name, pid in pids.items()})
    if own:
        spent[own] = time.process_time() - own_before
    if children:
        spent[children] = _waited_children_cpu() - children_before


def local_database_pid(url: str) -> int | None:
    """mariadbd's pid when the server runs on this machine (for its CPU figure), else None."""
    if make_url(url).host not in {"127.0.0.1", "localhost", "::1", None}:
        return None
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() in {"mariadbd", "mysqld"}:
                    found.append(int(entry.name))
    return found[0] if len(found) == 1 else None
