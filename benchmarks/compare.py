"""seckill against the naive SQL strategies: the same crowd on one hot item, one run, audited.

Three servers, one after the other, each sent the same crowd over HTTP:

* ``rowlock``: ``SELECT ... FOR UPDATE`` on the item's row, then UPDATE and INSERT, one
  transaction (``baselines.py``).
* ``conditional``: ``UPDATE ... WHERE stock >= q``, then INSERT, one transaction
  (``baselines.py``).
* ``seckill``: the product as it runs: ``seckill serve`` (the API with its persister, reaper and
  reconciler in one process) over its own redis-server (AOF on, ``appendfsync everysec``: the
  product's default) and its own MariaDB database.

The baselines are here as yardsticks, not product code: each is written correctly (no oversell,
the per-buyer limit and idempotency keys kept inside its transaction, deadlocks retried) and
served the way seckill is: FastAPI on uvicorn on uvloop, one process, the same bearer tokens,
bodies and errors, a pool of SQL connections as large as the crowd's concurrency (64 at most).
seckill's purchases also carry a purchase ticket, fetched before the clock starts.

The crowd: N buyers (default 5,000) race for one item of U units (default 100), at most one per
buyer, from C concurrent keep-alive connections (default 64) of one aiohttp client. Each buyer
sends one purchase (quantity 1, its own idempotency key); one buyer in ten sends it again with the
same key once answered, as a client that retries does, and must get the same answer. Tokens are
minted before the timed part; each server is warmed up first with a few purchases of another
item. Only the purchase requests are timed.

How to read it: ``req/s`` is purchase requests answered over the wall time of the timed part;
p50/p99 are per request latencies at the client. With many more buyers than units most of the
crowd is refused (409 ``sold_out``), as in a real flash sale, so what a refusal costs weighs
most; ``--units`` near ``--buyers`` measures the selling path instead. The ``cpu`` line says
where the time went: CPU seconds, over the timed part, of the server process, the store behind
it (redis-server or mariadbd, when local) and the client. A server near one CPU second per
second of wall time is limited by its own Python process; one well below it waits on something
else (for the baselines, the item's row lock: the ``innodb_row_lock_*`` line, server-wide
counters, so other work on the same MariaDB shows up in them). Client, servers and database
share this one machine: a figure is this machine's, and noisy when it is busy.

The audit, after each run (seckill's once its stream has drained into SQL): from the SQL rows,
units sold against the total (``oversold``), stock below zero, stock + units ordered == total
(``balanced``), duplicate orders (two rows for one buyer and key, or more units for one buyer
than the limit), orders answered 202 but missing in SQL (``lost``), rows no 202 announced
(``unannounced``: a request whose answer the client never got) and repeats answered differently
from the first time. With more buyers than units and every request answered, ``stock_left``
is 0.

Needs a MariaDB (``--mariadb-url``, default ``$SECKILL_TEST_MARIADB_URL``, else
root@127.0.0.1:3306). The databases ``seckill_compare_<strategy>`` are dropped and created afresh
and dropped again at the end (``--keep-databases`` leaves them for a look). The servers listen on
free loopback ports and are stopped at the end, also on an error or Ctrl-C. The last line printed
is one JSON object; the exit code is 1 if an audit is not clean.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import uvloop
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from benchmarks._support import free_port, redis_binary
from benchmarks.baselines import Strategy, add_item, create_schema
from seckill.config import Settings
from seckill.redis_server import RedisServer
from seckill.security.tickets import TICKET_HEADER
from seckill.security.tokens import Role, token_codec
from seckill.store.database import create_database, drop_database

DEFAULT_URL = "mysql+asyncmy://root@127.0.0.1:3306/test"
STRATEGIES = ("rowlock", "conditional", "seckill")
ROOT = Path(__file__).resolve().parent.parent  # the project: ``benchmarks`` is a package in it
# Fixed secrets: the servers and this client must agree, and nothing here is worth protecting.
JWT_SECRET = "seckill-compare-jwt-secret-" + "j" * 32
PAYMENT_SECRET = "seckill-compare-payment-secret-" + "p" * 32
TICKET_SECRET = "seckill-compare-ticket-secret-" + "t" * 32
JWT_ISSUER, JWT_AUDIENCE = "seckill", "seckill-api"
TOKEN_TTL_S = 3600
HOLD_SECONDS = 3600  # no hold expires during a run: the audit sees every order held
MAIN_ITEM, WARM_ITEM = 1, 2  # the baselines' item ids (seckill assigns its own)
BODY = json.dumps({"quantity": 1}).encode()
STARTUP_TIMEOUT_S = 60
DRAIN_TIMEOUT_S = 120
STOP_TIMEOUT_S = 20


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--buyers", type=int, default=5_000, help="buyers in the crowd")
    parser.add_argument("--concurrency", type=int, default=64, help="connections in flight")
    parser.add_argument("--units", type=int, default=100, help="units of the hot item")
    parser.add_argument(
        "--repeat-share", type=float, default=0.1,
        help="share of buyers who send their purchase again with the same key",
    )  # fmt: skip
    parser.add_argument(
        "--warm-up", type=int, default=128, help="purchases of another item before the clock"
    )
    parser.add_argument(
        "--mariadb-url",
        default=os.environ.get("SECKILL_TEST_MARIADB_URL") or DEFAULT_URL,
        help="MariaDB server (SQLAlchemy asyncmy URL); its databases seckill_compare_* are "
        "created afresh (default: $SECKILL_TEST_MARIADB_URL, else %(default)s)",
    )
    parser.add_argument(
        "--keep-databases", action="store_true", help="leave the databases for a look"
    )
    parser.add_argument(
        "--redis-server", help="redis-server binary (default: the one on PATH, else the bundled)"
    )
    args = parser.parse_args(argv)
    for name in ("buyers", "concurrency", "units", "warm_up"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 <= args.repeat_share <= 1:
        parser.error("--repeat-share must be between 0 and 1")
    return args


# -- the crowd -----------------------------------------------------------------------------------


@dataclass(slots=True)
class Buyer:
    name: str
    token: str
    key: str
    repeats: bool
    ticket: str = ""  # seckill only, fetched before the clock starts

    def headers(self) -> dict[str, str]:
        headers = {
            "Authorization": f"Bearer {self.token}",
            "Idempotency-Key": self.key,
            "Content-Type": "application/json",
        }
        if self.ticket:
            headers[TICKET_HEADER] = self.ticket
        return headers


def client_settings(data_dir: Path) -> Settings:
    """The token settings every server gets: fixed, whatever this shell's SECKILL_* say."""
    return Settings(
        _env_file=None,
        data_dir=data_dir,
        jwt_algorithm="HS256",
        jwt_secret=JWT_SECRET,
        jwt_issuer=JWT_ISSUER,
        jwt_audience=JWT_AUDIENCE,
    )


def make_crowd(settings: Settings, prefix: str, count: int, repeat_share: float) -> list[Buyer]:
    """``count`` buyers with tokens; ``repeat_share`` of them, evenly spread, send twice."""
    codec = token_codec(settings)
    return [
        Buyer(
            name=f"{prefix}{i}",
            token=codec.mint(f"{prefix}{i}", Role.BUYER, ttl_seconds=TOKEN_TTL_S),
            key=f"key-{prefix}{i}",
            repeats=int((i + 1) * repeat_share) > int(i * repeat_share),
        )
        for i in range(count)
    ]


def admin_headers(settings: Settings) -> dict[str, str]:
    token = token_codec(settings).mint("bench", Role.ADMIN, ttl_seconds=TOKEN_TTL_S)
    return {"Authorization": f"Bearer {token}"}


# -- processes we own ----------------------------------------------------------------------------


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    # Linux: if this benchmark is killed outright, the servers it started go too.
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


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
    argv: list[str], *, env: dict[str, str], cwd: Path, log: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """A child process, stopped with SIGTERM (SIGKILL if it lingers) however the block ends."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
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


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU so far of a process and its live descendants (the worker processes
    of a supervisor), from Linux /proc; 0 if unknown."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        children = [
            int(child)
            for task in Path(f"/proc/{pid}/task").iterdir()
            for child in (task / "children").read_text().split()
        ]
    except OSError:
        return 0.0
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return own + sum(cpu_seconds(child) for child in children)


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


# -- HTTP ----------------------------------------------------------------------------------------


@dataclass
class Run:
    """What the client saw of one strategy's timed part."""

    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)  # answered requests
    statuses: Counter[str] = field(default_factory=Counter)  # "202", "409 sold_out", ...
    accepted: set[str] = field(default_factory=set)  # order ids answered 202
    repeat_mismatches: int = 0
    last_sale_s: float = 0.0  # from the start until the last new order was answered
    cpu: dict[str, float] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def answered(self) -> int:
        return len(self.latencies_ms)

    @property
    def per_second(self) -> float:
        return self.answered / self.seconds if self.seconds else 0.0

    def percentile(self, p: int) -> float:
        if len(self.latencies_ms) < 2:
            return self.latencies_ms[0] if self.latencies_ms else 0.0
        return statistics.quantiles(self.latencies_ms, n=100, method="inclusive")[p - 1]

    def count(self, status: str) -> int:
        return sum(n for s, n in self.statuses.items() if s.split()[0] == status)

    def others(self) -> str:
        rest = {s: n for s, n in self.statuses.items() if s.split()[0] not in {"202", "409"}}
        return ", ".join(f"{s}: {n}" for s, n in sorted(rest.items())) or "-"


def session(concurrency: int) -> aiohttp.ClientSession:
    # Idle connections are dropped before uvicorn's keep-alive (5 s) closes them under us.
    connector = aiohttp.TCPConnector(limit=concurrency, keepalive_timeout=2)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60))


async def call(
    http: aiohttp.ClientSession, method: str, url: str, **options: Any
) -> tuple[int, Any]:
    async with http.request(method, url, **options) as response:
        body = await response.read()
        try:
            return response.status, json.loads(body) if body else None
        except ValueError:
            return response.status, body.decode(errors="replace")


async def wait_healthy(
    http: aiohttp.ClientSession, base: str, process: subprocess.Popen[bytes], log: Path
) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        if process.poll() is not None:
            sys.exit(f"the server exited at start (code {process.returncode}):\n{log_tail(log)}")
        with contextlib.suppress(TimeoutError, aiohttp.ClientError):
            status, _ = await call(http, "GET", base + "/healthz")
            if status == 200:
                return
        if time.monotonic() > deadline:
            sys.exit(f"the server did not answer /healthz in {STARTUP_TIMEOUT_S} s:\n"
                     f"{log_tail(log)}")  # fmt: skip
        await asyncio.sleep(0.1)


async def buy_all(
    http: aiohttp.ClientSession, base: str, item_id: int, crowd: list[Buyer], concurrency: int
) -> Run:
    """Every buyer's purchase (and repeat), ``concurrency`` at a time, each one timed."""
    url = f"{base}/api/v1/items/{item_id}/orders"
    headers = [buyer.headers() for buyer in crowd]  # built before the clock starts
    run = Run()
    turns = iter(range(len(crowd)))  # shared: a connection takes the next buyer once free

    async def once(i: int) -> tuple[str, str | None]:
        sent = time.perf_counter()
        try:
            async with http.post(url, data=BODY, headers=headers[i]) as response:
                body = await response.read()
                status = response.status
        except (TimeoutError, aiohttp.ClientError) as exc:
            run.statuses[f"error {type(exc).__name__}"] += 1
            return "error", None
        answered = time.perf_counter()
        run.latencies_ms.append((answered - sent) * 1000)
        answer = json.loads(body) if body else {}
        if status == 202:
            order_id = str(answer["order_id"])
            if order_id not in run.accepted:
                run.accepted.add(order_id)
                run.last_sale_s = answered - started
            run.statuses["202"] += 1
            return "202", order_id
        run.statuses[f"{status} {answer.get('error', '?')}"] += 1
        return str(status), None

    async def connection() -> None:
        for i in turns:
            first = await once(i)
            if crowd[i].repeats and await once(i) != first:
                run.repeat_mismatches += 1

    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(connection())
    run.seconds = time.perf_counter() - started
    return run


async def warm_up(
    http: aiohttp.ClientSession, base: str, item_id: int, buyers: list[Buyer], concurrency: int
) -> None:
    """Purchases of another item: connections opened, pools filled, code paths run once."""
    run = await buy_all(http, base, item_id, buyers, concurrency)
    if run.statuses != Counter({"202": len(buyers)}):
        sys.exit(f"warm-up: expected {len(buyers)} accepted purchases, got {dict(run.statuses)}")


async def timed(
    http: aiohttp.ClientSession,
    base: str,
    item_id: int,
    crowd: list[Buyer],
    concurrency: int,
    pids: Mapping[str, int | None],
) -> Run:
    """The timed part, with the CPU each process spent over it."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    client_before = time.process_time()
    run = await buy_all(http, base, item_id, crowd, concurrency)
    run.cpu = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
    run.cpu["client"] = time.process_time() - client_before
    return run


# -- the database --------------------------------------------------------------------------------


async def fresh_database(server_url: str, name: str) -> str:
    await drop_database(server_url, name)
    return await create_database(server_url, name)


async def lock_status(engine: AsyncEngine) -> dict[str, int]:
    """InnoDB's server-wide row-lock and deadlock counters."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SHOW GLOBAL STATUS WHERE Variable_name IN "
                 "('Innodb_row_lock_waits', 'Innodb_row_lock_time', 'Innodb_deadlocks')")
        )  # fmt: skip
        return {str(name).lower(): int(value) for name, value in rows}


async def server_facts(url: str) -> str:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            version = str((await conn.execute(text("SELECT VERSION()"))).scalar_one())
            flush = (
                await conn.execute(text("SELECT @@innodb_flush_log_at_trx_commit"))
            ).scalar_one()
        return f"MariaDB {version.split('-')[0]}, innodb_flush_log_at_trx_commit={flush}"
    finally:
        await engine.dispose()


def audit(
    *,
    total: int,
    stock: int,
    rows: Sequence[tuple[int, str, str | None, int]],  # order id, buyer, key (if kept), units
    limit: int,
    run: Run,
) -> dict[str, Any]:
    """What the SQL rows say, checked against what the API answered."""
    sold = sum(units for *_, units in rows)
    per_buyer: Counter[str] = Counter()
    per_key: Counter[tuple[str, str]] = Counter()
    for _, buyer, key, units in rows:
        per_buyer[buyer] += units
        if key is not None:
            per_key[(buyer, key)] += 1
    duplicates = sum(n - 1 for n in per_key.values()) + sum(
        units - limit for units in per_buyer.values() if units > limit
    )
    in_sql = {str(order_id) for order_id, *_ in rows}
    result = {
        "total": total,
        "sold": sold,
        "stock_left": stock,
        "oversold": max(0, sold - total),
        "negative_stock": stock < 0,
        "balanced": stock + sold == total,
        "duplicates": duplicates,
        "lost": len(run.accepted - in_sql),
        "unannounced": len(in_sql - run.accepted),
        "repeat_mismatches": run.repeat_mismatches,
    }
    result["clean"] = (
        result["oversold"] == 0
        and not result["negative_stock"]
        and result["balanced"]
        and duplicates == 0
        and result["lost"] == 0
        and run.repeat_mismatches == 0
    )
    return result


# -- the baselines -------------------------------------------------------------------------------


def run_baseline(
    strategy: Strategy, args: argparse.Namespace, crowd: list[Buyer], warmers: list[Buyer],
    workdir: Path,
) -> tuple[Run, dict[str, Any]]:  # fmt: skip
    name = f"seckill_compare_{strategy.value}"
    url = uvloop.run(fresh_database(args.mariadb_url, name))
    try:
        uvloop.run(create_schema(url))
        uvloop.run(add_item(url, item_id=MAIN_ITEM, total=args.units, per_buyer_limit=1))
        uvloop.run(add_item(url, item_id=WARM_ITEM, total=len(warmers), per_buyer_limit=1))
        port, log = free_port(), workdir / f"{strategy.value}.log"
        argv = [
            sys.executable, "-m", "benchmarks.baselines", "--strategy", strategy.value,
            "--database-url", url, "--port", str(port),
            "--pool-size", str(min(args.concurrency, 64)),
        ]  # fmt: skip
        env = child_env(server_settings(args, workdir / strategy.value))
        with running(argv, env=env, cwd=workdir, log=log) as process:
            run = uvloop.run(drive_baseline(args, crowd, warmers, port, process, log))
        if process.returncode not in (0, -signal.SIGTERM):
            print(f"{strategy.value}: the server exited with {process.returncode}:\n"
                  f"{log_tail(log)}")  # fmt: skip
        found = uvloop.run(read_baseline(url))
        return run, audit(**found, limit=1, run=run)
    finally:
        if not args.keep_databases:
            uvloop.run(drop_database(args.mariadb_url, name))


def server_settings(args: argparse.Namespace, data_dir: Path) -> dict[str, object]:
    """What every server is told: the tokens' settings, and limits the crowd stays within."""
    return {
        "data_dir": data_dir,
        "jwt_algorithm": "HS256",
        "jwt_secret": JWT_SECRET,
        "jwt_issuer": JWT_ISSUER,
        "jwt_audience": JWT_AUDIENCE,
        "payment_secret": PAYMENT_SECRET,
        "ticket_secret": TICKET_SECRET,
        # The crowd keeps `concurrency` purchases in flight: none may be shed for that.
        "admission_max_in_flight": max(512, 2 * args.concurrency),
    }


async def drive_baseline(
    args: argparse.Namespace,
    crowd: list[Buyer],
    warmers: list[Buyer],
    port: int,
    process: subprocess.Popen[bytes],
    log: Path,
) -> Run:
    base = f"http://127.0.0.1:{port}"
    status_engine = create_async_engine(args.mariadb_url, pool_size=1)
    try:
        async with session(args.concurrency) as http:
            await wait_healthy(http, base, process, log)
            await warm_up(http, base, WARM_ITEM, warmers, args.concurrency)
            locks_before = await lock_status(status_engine)
            pids = {"server": process.pid, "mariadb": local_database_pid(args.mariadb_url)}
            run = await timed(http, base, MAIN_ITEM, crowd, args.concurrency, pids)
            locks_after = await lock_status(status_engine)
            _, health = await call(http, "GET", base + "/healthz")
    finally:
        await status_engine.dispose()
    run.notes = {name: locks_after[name] - locks_before[name] for name in locks_before}
    run.notes |= {"lock_retries": health["retries"], "gave_up": health["gave_up"]}
    return run


_BASELINE_ORDERS = text(
    "SELECT id, buyer, idempotency_key, quantity FROM orders WHERE item_id = :i"
)


async def read_baseline(url: str) -> dict[str, Any]:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            total, stock = (
                await conn.execute(
                    text("SELECT total, stock FROM items WHERE item_id = :i"), {"i": MAIN_ITEM}
                )
            ).one()
            rows = (await conn.execute(_BASELINE_ORDERS, {"i": MAIN_ITEM})).all()
    finally:
        await engine.dispose()
    return {"total": total, "stock": stock, "rows": [tuple(row) for row in rows]}


# -- seckill -------------------------------------------------------------------------------------


def run_seckill(
    args: argparse.Namespace, crowd: list[Buyer], warmers: list[Buyer], workdir: Path
) -> tuple[Run, dict[str, Any]]:
    name = "seckill_compare_seckill"
    seckill = Path(sys.executable).with_name("seckill")
    url = uvloop.run(fresh_database(args.mariadb_url, name))
    try:
        with RedisServer(
            binary=redis_binary(args.redis_server), data_dir=workdir / "redis",
            port=free_port(), appendonly=True,
        ) as redis:  # fmt: skip
            env = child_env(
                server_settings(args, workdir / "seckill")
                | {
                    "redis_url": redis.url,
                    "database_url": url,
                    "ticket_ttl_seconds": 3 * TOKEN_TTL_S,  # tickets outlive the run
                    "redis_max_connections": max(64, args.concurrency),
                }
            )
            upgraded = subprocess.run(
                [str(seckill), "db", "upgrade"], env=env, cwd=workdir, capture_output=True
            )
            if upgraded.returncode != 0:
                sys.exit(f"seckill db upgrade failed:\n{upgraded.stdout.decode()}"
                         f"{upgraded.stderr.decode()}")  # fmt: skip
            port, log = free_port(), workdir / "seckill.log"
            argv = [str(seckill), "serve", "--host", "127.0.0.1", "--port", str(port)]
            with running(argv, env=env, cwd=workdir, log=log) as process:
                assert redis.process is not None
                pids = {"server": process.pid, "redis": redis.process.pid}
                run, item_id = uvloop.run(
                    drive_seckill(args, crowd, warmers, port, process, log, pids)
                )
        found = uvloop.run(read_seckill(url, item_id))
        return run, audit(**found, limit=1, run=run)
    finally:
        if not args.keep_databases:
            uvloop.run(drop_database(args.mariadb_url, name))


async def drive_seckill(
    args: argparse.Namespace,
    crowd: list[Buyer],
    warmers: list[Buyer],
    port: int,
    process: subprocess.Popen[bytes],
    log: Path,
    pids: Mapping[str, int | None],
) -> tuple[Run, int]:
    base = f"http://127.0.0.1:{port}"
    admin = admin_headers(client_settings(Path(".")))
    async with session(args.concurrency) as http:
        await wait_healthy(http, base, process, log)
        item_id = await create_item(http, base, admin, total=args.units)
        warm_item = await create_item(http, base, admin, total=len(warmers))
        await fetch_tickets(http, base, warm_item, warmers, args.concurrency)
        await fetch_tickets(http, base, item_id, crowd, args.concurrency)
        await warm_up(http, base, warm_item, warmers, args.concurrency)
        run = await timed(http, base, item_id, crowd, args.concurrency, pids)
        started = time.perf_counter()
        await drained(http, base, admin, item_id)
        run.notes = {"drained_after_s": round(time.perf_counter() - started, 2)}
    return run, item_id


async def create_item(
    http: aiohttp.ClientSession, base: str, admin: dict[str, str], *, total: int
) -> int:
    """An item on sale now, created and warmed through the admin routes."""
    now = datetime.now(UTC)
    status, body = await call(
        http, "POST", base + "/api/v1/admin/items", headers=admin,
        json={
            "name": "compare", "price_cents": 100, "total": total,
            "starts_at": (now - timedelta(minutes=1)).isoformat(),
            "ends_at": (now + timedelta(hours=2)).isoformat(),
            "per_buyer_limit": 1, "hold_seconds": HOLD_SECONDS,
        },
    )  # fmt: skip
    if status != 201:
        sys.exit(f"creating an item failed: {status} {body}")
    item_id = int(body["item_id"])
    status, body = await call(
        http, "POST", f"{base}/api/v1/admin/items/{item_id}/warm", headers=admin
    )
    if status != 200:
        sys.exit(f"warming item {item_id} failed: {status} {body}")
    return item_id


async def fetch_tickets(
    http: aiohttp.ClientSession, base: str, item_id: int, buyers: list[Buyer], concurrency: int
) -> None:
    url = f"{base}/api/v1/items/{item_id}/tickets"
    turns = iter(buyers)

    async def connection() -> None:
        for buyer in turns:
            status, body = await call(
                http, "POST", url, headers={"Authorization": f"Bearer {buyer.token}"}
            )
            if status != 200:
                sys.exit(f"no ticket for {buyer.name}: {status} {body}")
            buyer.ticket = body["ticket"]

    async with asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(connection())


async def drained(
    http: aiohttp.ClientSession, base: str, admin: dict[str, str], item_id: int
) -> None:
    """Until the item's stream has landed in SQL and both records agree."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while True:
        status, body = await call(http, "GET", f"{base}/api/v1/admin/items/{item_id}",
                                  headers=admin)  # fmt: skip
        if status == 200 and body["backlog"] == 0 and body["agree"]:
            return
        if time.monotonic() > deadline:
            sys.exit(f"the stream did not drain in {DRAIN_TIMEOUT_S} s: {status} {body}")
        await asyncio.sleep(0.2)


_SECKILL_ORDERS = text(
    "SELECT id, buyer, quantity FROM orders WHERE item_id = :i AND status IN ('held', 'paid')"
)


async def read_seckill(url: str, item_id: int) -> dict[str, Any]:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            total, available = (
                await conn.execute(
                    text("SELECT total, available FROM inventory WHERE item_id = :i"),
                    {"i": item_id},
                )
            ).one()
            # Held or paid orders hold units; seckill keeps no idempotency key in SQL (a
            # repeated key is checked through the answers instead).
            rows = (await conn.execute(_SECKILL_ORDERS, {"i": item_id})).all()
    finally:
        await engine.dispose()
    return {
        "total": total,
        "stock": available,
        "rows": [(order_id, buyer, None, quantity) for order_id, buyer, quantity in rows],
    }


# -- the report ----------------------------------------------------------------------------------


def report(results: dict[str, tuple[Run, dict[str, Any]]]) -> None:
    print(
        f"{'strategy':<12} {'requests':>8} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'202':>5} {'409':>6}  other"
    )
    for name, (run, _) in results.items():
        print(
            f"{name:<12} {sum(run.statuses.values()):>8} {run.per_second:>9,.0f} "
            f"{run.percentile(50):>8.2f} {run.percentile(99):>8.2f} {run.count('202'):>5} "
            f"{run.count('409'):>6}  {run.others()}"
        )
    for name, (run, found) in results.items():
        verdict = "clean" if found["clean"] else "NOT CLEAN"
        cpu = ", ".join(f"{k} {v:.1f}" for k, v in run.cpu.items())
        print(f"\n{name}: audit {verdict}: sold {found['sold']} of {found['total']}, "
              f"stock left {found['stock_left']}, oversold {found['oversold']}, "
              f"duplicates {found['duplicates']}, lost {found['lost']}, "
              f"unannounced {found['unannounced']}, balanced {found['balanced']}, "
              f"repeats answered differently {found['repeat_mismatches']}")  # fmt: skip
        print(f"  timed part {run.seconds:.2f} s, last unit sold at {run.last_sale_s:.2f} s; "
              f"CPU seconds over it: {cpu}")  # fmt: skip
        print(f"  answers: {', '.join(f'{s}: {n}' for s, n in sorted(run.statuses.items()))}")
        if run.notes:
            print(f"  {', '.join(f'{k} {v}' for k, v in run.notes.items())}")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    # MariaDB notes a DROP DATABASE IF EXISTS of nothing, and asyncmy logs every note.
    logging.getLogger("asyncmy").setLevel(logging.ERROR)
    results: dict[str, tuple[Run, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="seckill-compare-") as tmp:
        workdir = Path(tmp)
        settings = client_settings(workdir)
        crowd = make_crowd(settings, "b", args.buyers, args.repeat_share)
        repeats = sum(buyer.repeats for buyer in crowd)
        facts = uvloop.run(server_facts(args.mariadb_url))
        print(f"{args.buyers} buyers ({repeats} send twice) for {args.units} units, "
              f"{args.concurrency} connections; {facts}; {os.cpu_count()} CPUs")  # fmt: skip
        for strategy in (Strategy.ROWLOCK, Strategy.CONDITIONAL):
            warmers = make_crowd(settings, f"w{strategy.value}-", args.warm_up, 0)
            results[strategy.value] = run_baseline(strategy, args, crowd, warmers, workdir)
            print(f"{strategy.value}: done, {results[strategy.value][0].per_second:,.0f} req/s")
        warmers = make_crowd(settings, "wseckill-", args.warm_up, 0)
        results["seckill"] = run_seckill(args, crowd, warmers, workdir)
        print(f"seckill: done, {results['seckill'][0].per_second:,.0f} req/s\n")
    report(results)

    runs = {name: run for name, (run, _) in results.items()}
    summary: dict[str, Any] = {}
    for name in STRATEGIES:
        summary[f"{name}_rps"] = round(runs[name].per_second, 1)
    for name in STRATEGIES:
        summary[f"{name}_p50_ms"] = round(runs[name].percentile(50), 2)
        summary[f"{name}_p99_ms"] = round(runs[name].percentile(99), 2)
    for name in STRATEGIES[:2]:
        ratio = runs["seckill"].per_second / runs[name].per_second if runs[name].seconds else 0
        summary[f"ratio_seckill_{name}"] = round(ratio, 2)
    summary |= {
        "audit": {name: found for name, (_, found) in results.items()},
        "buyers": args.buyers,
        "concurrency": args.concurrency,
        "units": args.units,
        "requests": sum(runs["seckill"].statuses.values()),
    }
    print(json.dumps(summary))
    if not all(found["clean"] for _, found in results.values()):
        sys.exit(1)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        # The servers and databases were cleaned up on the way out.
        sys.exit("interrupted")
