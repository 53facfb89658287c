"""The buyer's routes against a hello-world on the same server stack: one run, audited.

Six targets, one after the other, from C keep-alive connections (default 64) for D seconds
(default 10) each, after a warm-up of a couple of seconds:

* ``hello``: a FastAPI app with one route on the purchase path that answers a small JSON body
  and reads nothing, served exactly as the product is by ``seckill api --server S``
  (``--server``, the product's default unless given): with uvicorn, its defaults (hence
  httptools) under ``uvloop.run``, on a socket from ``seckill.serve.listening_socket``
  (IPPROTO_TCP, so Nagle is off), and with ``--workers N`` N processes on that one socket; with
  granian, ``seckill.serve.granian_server``: a supervisor and N worker processes (one with
  ``--workers 1``), each on its own SO_REUSEPORT listener and a uvloop loop. The framework's
  floor. ``hello raw`` is the same with a bare ASGI callable instead of FastAPI: the floor of the
  server alone, which every ratio of the headline divides by. Both are sent the purchase's
  request (``POST /api/v1/items/{id}/orders`` with a bearer token, an ``Idempotency-Key``, a
  ``Seckill-Ticket`` and the body ``{"quantity":1}``). Under granian, ``hello rsgi`` is the bare
  hello on granian's own interface (RSGI: the answer handed over in one call, no ASGI messages):
  what ASGI itself costs a request (``rsgi_vs_bare_hello``, ``rsgi_cpu_us``).
* ``item``: ``GET /api/v1/items/{id}``, what every buyer reads first (the same request again
  and again: it names no buyer).
* ``ticket``: ``POST /api/v1/items/{id}/tickets``, every request a new buyer whose token the
  API has never seen, so each one is verified in full, as a crowd's first request is.
* ``purchase``: the product, ``seckill api --server S`` (the API alone) with a separate
  ``seckill worker persister`` landing the stream in SQL, over its own redis-server on a free
  port (AOF on, ``appendfsync everysec``: the product's default) and SQLite in a temporary
  directory (or ``--database-url``). One item of 10,000,000 units, one per buyer; every request
  is a new buyer with its own token, ticket and key, all prepared before the clock starts, so
  each one runs the reserve script and sells a unit.
* ``soldout``: the same route on a second item of a few units, bought out first; every request
  again a new buyer, each answered 409 ``sold_out`` (mostly from the process's sold-out flag).

The load comes from ``wrk`` (``-t2``, a Lua script rotating through the prepared requests and
counting statuses) when it is installed, else from the product's own client
(``seckill.crowd.client``, on aiohttp) in two processes (``--generator``).
Either way the generator shares this machine's CPUs with the server (and, for ``purchase``,
with redis-server and the persister): a figure is this machine's, and noisy when it is busy.
The ``cpu`` columns are CPU seconds per wall second, over the timed part, of the server (the
API process, or the hello's), redis-server, the persister and the generator: a server near 1.0
is bound by its own Python process; all of them together near the CPU count, by the machine.
The aiohttp generator is slower than the servers it drives and then measures itself as much as
them; prefer wrk. ``--profile DIR`` samples the server with py-spy over each timed part (its
collapsed stacks, one file per target).

How to read it: req/s is answers over the timed part's wall time; p50/p99 are per-request
latencies at the generator. The headline, ``vs_bare_hello``, is each route's req/s over the
bare server's: the routes are served ahead of the framework, so the server alone is their floor
(``vs_fastapi_hello`` divides by the FastAPI hello instead). ``journey_buyers_per_s`` is a
buyer's ticket and purchase one after the other at the rates measured. ``api_cpu_us`` is the
API process's CPU per answer and ``api_cpu_vs_bare`` the same over the bare hello's (the
server's floor per answer), ``redis_cpu_us_per_purchase`` redis-server's per purchase (the
persister's stream reads and acknowledgements included), ``persister_vs_api_cpu_per_purchase``
the persister's CPU per order over the API's per purchase. The product's roadmap targets,
against the bare hello: req/s of a refusal and an item read 0.5, a ticket 0.25, a purchase 0.2;
CPU per answer of an item read 1.5x, a refusal 1.7x, a ticket and a purchase 3x; a purchase p99
<= 25 ms at 64 connections; the persister at most half the API's CPU per purchase: targets to
judge the work by, not assertions; nothing here fails on a timing. After the runs the
persister's drain is timed as part of the audit (``drained_after_s``): during a spike the
stream is the buffer.

Every request is a new buyer, so the API never rate-limits or sheds honest traffic here: the
per-buyer rate limit (5 per second) and the admission limit (512 in flight, against at most
``--connections``) are left at their defaults; only the ticket lifetime is raised (tickets are
fetched before the clock). ``--workers N`` runs every server (hello, hello raw, the API) as N
processes on one port; the CPU figures add up each server's processes (granian's supervisor
included, which idles).

The audit, after the purchase runs: once the stream has landed (admin counters: backlog 0, Redis
and SQL agree), the admin audit route must pass, and the units held or sold in Redis must equal
the 202s answered (within the requests sent twice, if the prepared ones ran out, and those whose
answer went uncounted: in flight when wrk stopped, or given up on). The last line printed is one
JSON object; the exit code is 1 if the audit fails. Every process started here (servers,
redis-server, generators) is stopped at the end, also on an error or Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvloop

from benchmarks.harness import (
    Buyer,
    api,
    child_env,
    cpu_spent,
    create_item,
    credentials,
    durable_redis,
    fetch_tickets,
    free_port,
    make_crowd,
    profiled,
    py_spy,
    running,
    seckill_command,
    seckill_settings,
    serving,
    status_key,
    upgrade_database,
)
from seckill.config import Settings
from seckill.crowd.client import Credentials
from seckill.security.passes import PASS_HEADER
from seckill.security.tickets import TICKET_HEADER

BIG_ITEM_UNITS = 10_000_000
SOLDOUT_UNITS = 5
PATH = "/api/v1/items/{item_id}/orders"
BODY = b'{"quantity":1}'


@dataclass(frozen=True)
class Shape:
    """What a run's requests look like: each carries its own buyer's values where it sends any."""

    method: str
    path: str  # with {item_id}
    body: bytes
    # Of "token", "key", "ticket", "pass": the headers each request carries (a queue pass goes
    # where a ticket would: a request sends one or the other).
    sends: tuple[str, ...]


PURCHASE = Shape("POST", PATH, BODY, ("token", "key", "ticket"))
TICKET = Shape("POST", "/api/v1/items/{item_id}/tickets", b"", ("token",))
ITEM = Shape("GET", "/api/v1/items/{item_id}", b"", ())


@dataclass(frozen=True)
class Requests:
    """A run's prepared requests: one line per buyer in ``file`` (token, key, ticket)."""

    file: Path
    shape: Shape = PURCHASE

    def headers(self, token: str, key: str, ticket: str) -> dict[str, str]:
        values = {
            "token": ("Authorization", f"Bearer {token}"),
            "key": ("Idempotency-Key", key),
            "ticket": (TICKET_HEADER, ticket),
            "pass": (PASS_HEADER, ticket),
        }
        return dict(values[name] for name in self.shape.sends)


HELLO_BODY = b'{"message":"hello"}'
DRAIN_TIMEOUT_S = 300
SAMPLE_BUYERS = 2_000  # request shapes for the hello runs (they never reach the product)
MIN_POOL = 2_000


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0, help="seconds timed per target")
    parser.add_argument("--warm-up", type=float, default=2.0, help="seconds before each timing")
    parser.add_argument("--connections", type=int, default=64, help="keep-alive connections")
    parser.add_argument(
        "--workers", type=int, default=1, help="server processes, for hello and the API alike"
    )
    parser.add_argument(
        "--server",
        choices=("granian", "uvicorn"),
        default=Settings.model_fields["api_server"].default,
        help="what serves hello, hello raw and the API alike (default: seckill api's)",
    )
    parser.add_argument("--generator", choices=("auto", "wrk", "builtin"), default="auto")
    parser.add_argument(
        "--database-url",
        help="SQL database for the product (SQLAlchemy async URL; its schema is upgraded, "
        "items are added); default: SQLite in a temporary directory",
    )
    parser.add_argument(
        "--redis-server", help="redis-server binary (default: the one on PATH, else the bundled)"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="write a py-spy profile of the server (collapsed stacks) per timed target here",
    )
    parser.add_argument(
        "--native", action="store_true", help="with --profile: native frames too (py-spy --native)"
    )
    parser.add_argument(
        "--perf",
        type=Path,
        help="write a perf record of the server (kernel and native code too) per target here",
    )
    parser.add_argument("--serve-hello", choices=("fastapi", "raw", "rsgi"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_hello:
        return args
    if args.duration <= 0 or args.warm_up < 0:
        parser.error("--duration must be positive and --warm-up not negative")
    if args.connections < 2:
        parser.error("--connections must be at least 2")
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if args.generator == "wrk" and not shutil.which("wrk"):
        parser.error("--generator wrk: wrk is not installed (Debian: apt-get install wrk)")
    if args.profile is not None and not py_spy():
        parser.error("--profile: py-spy is not installed (pip install py-spy)")
    if args.generator == "auto":
        args.generator = "wrk" if shutil.which("wrk") else "builtin"
    return args


# -- the hello servers ---------------------------------------------------------------------------


def hello_fastapi() -> Any:
    from fastapi import FastAPI

    app = FastAPI()

    # The purchase route's path and method, so both are sent the very same request bytes.
    @app.post(PATH)
    async def hello(item_id: int) -> dict[str, str]:
        return {"message": "hello"}

    return app


async def hello_raw(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Plain ASGI: any request answered with a small JSON body, nothing read or routed."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": HELLO_BODY})


async def hello_rsgi(scope: Any, protocol: Any) -> None:
    """Plain RSGI, granian's own interface (granian only): the bare hello without ASGI's
    messages, the answer handed over in one call instead of two awaited sends."""
    protocol.response_bytes(200, [("content-type", "application/json")], HELLO_BODY)


def serve_hello(kind: str, port: int, workers: int, server: str) -> None:
    """Serve a hello app until SIGTERM, set up as ``seckill.serve`` sets up the API: under
    granian as ``seckill api --server granian`` runs it; under uvicorn in this process, or in
    ``workers`` processes on one socket as ``seckill api --workers`` does."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    from seckill.serve import granian_server, listening_socket

    app = f"benchmarks.http:hello_{kind}"
    if server == "granian":
        served = granian_server(
            app, factory=kind == "fastapi", host="127.0.0.1", port=port, processes=workers
        )
        if kind == "rsgi":  # the same server, speaking RSGI
            from granian.constants import Interfaces

            served.interface = Interfaces.RSGI
        served.serve()
        return
    sock = listening_socket("127.0.0.1", port)
    options: dict[str, Any] = {"log_level": "warning", "access_log": False, "lifespan": "on"}
    if workers > 1:
        config = uvicorn.Config(
            app, factory=kind == "fastapi", workers=workers, loop="uvloop", **options
        )
        Multiprocess(config, sockets=[sock]).run()
        return
    loaded = hello_fastapi() if kind == "fastapi" else hello_raw
    uvloop.run(uvicorn.Server(uvicorn.Config(loaded, **options)).serve(sockets=[sock]))


# -- the prepared requests -----------------------------------------------------------------------


def write_requests(
    buyers: Sequence[Buyer], who: Credentials, path: Path, shape: Shape = PURCHASE
) -> Requests:
    """One line per request: token, idempotency key, ticket (none of them holds a space; a
    buyer without a ticket yet writes "-")."""
    with path.open("w") as out:
        for buyer in buyers:
            out.write(f"{who.buyer(buyer.name)} {buyer.key} {buyer.ticket or '-'}\n")
    return Requests(path, shape)


def read_requests(requests: Requests, part: int, parts: int) -> list[dict[str, str]]:
    headers = []
    with requests.file.open() as lines:
        for i, line in enumerate(lines):
            if i % parts == part:
                headers.append(requests.headers(*line.split()))
    return headers


# -- the load ------------------------------------------------------------------------------------


@dataclass
class Load:
    """What the generator saw of one timed (or warm-up) run."""

    requests: int = 0
    seconds: float = 0.0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    statuses: Counter[str] = field(default_factory=Counter)  # "202", "409 sold_out", ...
    reused: int = 0  # requests sent again once the prepared ones ran out
    distinct: int = 0  # prepared requests sent at least once (answered or not)
    errors: int = 0  # connect/read/write errors and timeouts: no answer
    cpu: dict[str, float] = field(default_factory=dict)  # CPU s per wall s, per process

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def count(self, status: str) -> int:
        return sum(n for s, n in self.statuses.items() if s.split()[0] == status)

    def others(self, expected: str) -> str:
        rest = {s: n for s, n in self.statuses.items() if s != expected}
        if self.errors:
            rest["socket errors"] = self.errors
        return ", ".join(f"{s}: {n}" for s, n in sorted(rest.items())) or "-"


WRK_SCRIPT = r"""
local path, file, nthreads = "%(path)s", "%(file)s", %(threads)d
local body = %(body)s
local threads, started = {}, 0

function setup(thread)
  thread:set("id", started)
  started = started + 1
  table.insert(threads, thread)
end

function init(args)
  prepared, sent, reused, statuses = {}, 0, 0, {}
  local i = 0
  for line in io.lines(file) do
    if i %% nthreads == id then
      local token, key, ticket = line:match("^(%%S+) (%%S+) (%%S+)$")
      prepared[#prepared + 1] = wrk.format("%(method)s", path, {%(headers)s}, body)
    end
    i = i + 1
  end
end

function request()
  sent = sent + 1
  if sent > #prepared then reused = reused + 1 end
  return prepared[(sent - 1) %% #prepared + 1]
end

function response(status, headers, body)
  local key = tostring(status)
  if status >= 300 then
    key = key .. " " .. (body:match('"error"%%s*:%%s*"([^"]+)"') or "?")
  end
  statuses[key] = (statuses[key] or 0) + 1
end

function done(summary, latency, requests)
  local total, reused_all, distinct = {}, 0, 0
  for _, thread in ipairs(threads) do
    for status, n in pairs(thread:get("statuses")) do
      total[status] = (total[status] or 0) + n
    end
    reused_all = reused_all + thread:get("reused")
    distinct = distinct + thread:get("sent") - thread:get("reused")
  end
  local parts = {}
  for status, n in pairs(total) do
    parts[#parts + 1] = string.format('"%%s": %%d', status, n)
  end
  local e = summary.errors
  io.write(string.format(
    'WRK-JSON {"requests": %%d, "duration_us": %%d, "p50_us": %%d, "p99_us": %%d, ' ..
    '"reused": %%d, "distinct": %%d, "errors": %%d, "statuses": {%%s}}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    reused_all, distinct, e.connect + e.read + e.write + e.timeout, table.concat(parts, ", ")))
end
"""


WRK_HEADERS = {
    "token": '["Authorization"] = "Bearer " .. token',
    "key": '["Idempotency-Key"] = key',
    "ticket": f'["{TICKET_HEADER}"] = ticket',
    "pass": f'["{PASS_HEADER}"] = ticket',
}


def run_wrk(
    url: str, item_id: int, requests: Requests, seconds: float, args: argparse.Namespace
) -> Load:
    shape = requests.shape
    headers = [WRK_HEADERS[name] for name in shape.sends]
    if shape.body:
        headers.append('["Content-Type"] = "application/json"')
    script = requests.file.with_suffix(".lua")
    script.write_text(
        WRK_SCRIPT
        % {
            "method": shape.method,
            "path": shape.path.format(item_id=item_id),
            "file": str(requests.file),
            "threads": 2,
            "body": f"'{shape.body.decode()}'" if shape.body else "nil",
            "headers": ", ".join(headers),
        }
    )
    argv = [
        "wrk", "-t2", f"-c{args.connections}", f"-d{max(1, round(seconds))}s", "--timeout", "10s",
        "--latency", "-s", str(script), url,
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    found = [line for line in done.stdout.splitlines() if line.startswith("WRK-JSON ")]
    if done.returncode != 0 or not found:
        sys.exit(f"wrk failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    figures = json.loads(found[-1].removeprefix("WRK-JSON "))
    return Load(
        requests=figures["requests"],
        seconds=figures["duration_us"] / 1e6,
        p50_ms=figures["p50_us"] / 1000,
        p99_ms=figures["p99_us"] / 1000,
        statuses=Counter(figures["statuses"]),
        reused=figures["reused"],
        distinct=figures["distinct"],
        errors=figures["errors"],
    )


async def _load_part(
    url: str, requests: Requests, path: str, part: int, parts: int, connections: int,
    start_at: float, seconds: float,
) -> dict[str, Any]:  # fmt: skip
    prepared = read_requests(requests, part, parts)
    method, body = requests.shape.method, requests.shape.body or None
    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    sent = errors = 0
    async with api(url, credentials(), connections, keepalive_s=30, timeout_s=10) as client:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        stop_at = time.perf_counter() + seconds

        async def connection() -> None:
            nonlocal sent, errors
            while time.perf_counter() < stop_at:
                headers = prepared[sent % len(prepared)]
                sent += 1
                reply = await client.request(method, path, raw=body, headers=headers)
                if reply.status == 0:
                    errors += 1
                    continue
                latencies.append(reply.ms)
                statuses[status_key(reply)] += 1

        began = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for _ in range(connections):
                group.create_task(connection())
        elapsed = time.perf_counter() - began
    return {
        "latencies": latencies,
        "statuses": dict(statuses),
        "reused": max(0, sent - len(prepared)),
        "distinct": min(sent, len(prepared)),
        "errors": errors,
        "seconds": elapsed,
    }


def load_part(*options: Any) -> dict[str, Any]:
    """One generator process's share of the load (run in a child process)."""
    return uvloop.run(_load_part(*options))


def run_builtin(
    url: str, item_id: int, requests: Requests, seconds: float, args: argparse.Namespace
) -> Load:
    parts = 2  # the machine's 2 cores; the server shares them
    path = requests.shape.path.format(item_id=item_id)
    start_at = time.time() + 1.0  # both processes have started and connected by then
    shares = [args.connections // parts + (i < args.connections % parts) for i in range(parts)]
    with multiprocessing.get_context("spawn").Pool(parts) as pool:
        found = pool.starmap(
            load_part,
            [(url, requests, path, i, parts, shares[i], start_at, seconds) for i in range(parts)],
        )
    latencies = sorted(x for part in found for x in part["latencies"])
    load = Load(
        requests=len(latencies),
        seconds=max(part["seconds"] for part in found),
        reused=sum(part["reused"] for part in found),
        distinct=sum(part["distinct"] for part in found),
        errors=sum(part["errors"] for part in found),
    )
    for part in found:
        load.statuses.update(part["statuses"])
    if latencies:
        load.p50_ms = latencies[(len(latencies) - 1) * 50 // 100]
        load.p99_ms = latencies[(len(latencies) - 1) * 99 // 100]
    return load


def generate(
    url: str, item_id: int, requests: Requests, seconds: float, args: argparse.Namespace
) -> Load:
    run = run_wrk if args.generator == "wrk" else run_builtin
    return run(url, item_id, requests, seconds, args)


def timed(
    name: str, url: str, item_id: int, requests: Requests, args: argparse.Namespace,
    pids: dict[str, int | None],
) -> Load:  # fmt: skip
    """The timed part, with the CPU each server process spent over it."""
    print(f"{name}: timing {args.duration:g} s", flush=True)
    # wrk, or the generator processes: children this process waits for.
    with cpu_spent(pids, children="generator") as spent, profiled(name, pids["server"], args):
        load = generate(url, item_id, requests, args.duration, args)
    load.cpu = {proc: s / load.seconds if load.seconds else 0.0 for proc, s in spent.items()}
    print(f"{name}: {load.per_second:,.0f} req/s, p99 {load.p99_ms:.2f} ms", flush=True)
    return load


# -- the product ---------------------------------------------------------------------------------


@contextlib.contextmanager
def hello_server(
    kind: str, workdir: Path, args: argparse.Namespace
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port, log = free_port(), workdir / f"hello-{kind}.log"
    argv = [sys.executable, "-m", "benchmarks.http", "--serve-hello", kind, "--port", str(port)]
    argv += ["--workers", str(args.workers), "--server", args.server]
    with serving(argv, port=port, env=child_env({}), cwd=workdir, log=log, path="/") as process:
        yield f"http://127.0.0.1:{port}", process


@dataclass(kw_only=True)
class Product:
    url: str
    who: Credentials
    workdir: Path
    concurrency: int
    big_item: int = 0
    soldout_item: int = 0
    made: int = 0  # buyers minted so far (each one a new name)

    async def buyers(self, item_id: int, count: int) -> list[Buyer]:
        """``count`` new buyers with tokens and tickets for ``item_id``."""
        crowd = make_crowd(self.who, f"b{self.made}-", count)
        self.made += count
        async with api(self.url, self.who, self.concurrency) as client:
            await fetch_tickets(client, item_id, crowd, self.concurrency)
        return crowd

    def requests(self, item_id: int, count: int, name: str, shape: Shape = PURCHASE) -> Requests:
        """``count`` new buyers for ``item_id``, written for a run. A purchase's buyers hold
        their tickets; a ticket's have only tokens the API has never seen (each one verified
        in full, as a crowd's first request is)."""
        if shape is TICKET:
            crowd = make_crowd(self.who, f"b{self.made}-", count)
            self.made += count
        else:
            crowd = uvloop.run(self.buyers(item_id, count))
        return write_requests(crowd, self.who, self.workdir / f"{name}.txt", shape)

    async def set_up(self) -> None:
        async with api(self.url, self.who, self.concurrency) as client:
            self.big_item = await create_item(client, total=BIG_ITEM_UNITS)
            self.soldout_item = await create_item(client, total=SOLDOUT_UNITS)


async def buy_out(product: Product) -> int:
    """The second item bought out by a few buyers; how many were accepted."""
    item_id = product.soldout_item
    crowd = await product.buyers(item_id, SOLDOUT_UNITS)
    async with api(product.url, product.who, product.concurrency) as client:
        answers = [
            await client.buy(item_id, buyer.name, ticket=buyer.ticket, key=buyer.key, quantity=1)
            for buyer in crowd
        ]
        counters = await client.counters(item_id)
    if any(a.status != 202 for a in answers) or counters.body["redis"]["available"] != 0:
        sys.exit(f"buying out item {item_id} failed: {answers} {counters.body}")
    return len(answers)


async def audit(product: Product, *, accepted: int, reused: int, distinct: int) -> dict[str, Any]:
    """Wait for the stream to land and the counters to settle, then the admin audit and the units
    held against the 202s. Settled means unchanged for a second: requests in flight when the
    generator stopped are still being answered, and each may hold a unit after the last look."""
    started = time.monotonic()
    async with api(product.url, product.who, 4) as client:
        last: dict[str, Any] | None = None
        while True:
            reply = await client.counters(product.big_item)
            counters = reply.body
            landed = reply.status == 200 and counters["backlog"] == 0 and counters["agree"]
            if landed and counters == last:
                break
            last = counters if landed else None
            if time.monotonic() - started > DRAIN_TIMEOUT_S:
                return {"passed": False, "drained": False, "counters": counters}
            await asyncio.sleep(1.0 if landed else 0.2)
        drained_s = time.monotonic() - started
        checked = await client.audit(product.big_item)
    status, found = checked.status, checked.body
    redis = counters["redis"]
    units = redis["held"] + redis["sold"]
    # Each 202 not to a repeat (a request sent again once the prepared ones ran out) is one
    # unit; no prepared request can take more than one, and one whose answer was not counted
    # (in flight when the generator stopped, or given up on) may have taken one unseen.
    units_match = accepted - reused <= units <= distinct
    failed = [c["name"] for c in found.get("checks", []) if not c["ok"]] if status == 200 else []
    return {
        "passed": status == 200 and bool(found["passed"]) and units_match,
        "audit_route_passed": status == 200 and bool(found["passed"]),
        "checks_failed": failed if status == 200 else [f"{status} {found}"],
        "drained_after_s": round(drained_s, 2),
        "backlog": counters["backlog"],
        "agree": counters["agree"],
        "accepted_202": accepted,
        "units_held_or_sold": units,
        "units_match": units_match,
        "reused": reused,
        "distinct_sent": distinct,
    }


# -- the report ----------------------------------------------------------------------------------


def report(loads: dict[str, Load], expected: dict[str, str]) -> None:
    cpus = ["server", "redis", "persister", "generator"]
    print(f"\n{'target':<11} {'requests':>9} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'expected':>14} {'got':>9}  cpu ({', '.join(cpus)})  other")  # fmt: skip
    for name, load in loads.items():
        cpu = " ".join(f"{load.cpu.get(proc, 0):.2f}" for proc in cpus)
        print(f"{name:<11} {load.requests:>9,} {load.per_second:>9,.0f} {load.p50_ms:>8.2f} "
              f"{load.p99_ms:>8.2f} {expected[name]:>14} {load.statuses[expected[name]]:>9,}  "
              f"{cpu}  {load.others(expected[name])}")  # fmt: skip


def measure(
    args: argparse.Namespace, product: Product, loads: dict[str, Load],
    pids: dict[str, int | None],
) -> dict[str, Any]:  # fmt: skip
    """hello, hello raw, purchase and soldout, one after the other, into ``loads``; the audit."""
    workdir = product.workdir
    # Request shapes for the hello runs: they never reach the product, so may be sent again.
    sample = product.requests(product.big_item, SAMPLE_BUYERS, "sample")
    hellos = [("fastapi", "hello"), ("raw", "hello raw")]
    if args.server == "granian":  # what the ASGI interface costs a request, beside the bare one
        hellos.append(("rsgi", "hello rsgi"))
    for kind, name in hellos:
        with hello_server(kind, workdir, args) as (hello_url, process):
            if args.warm_up:
                generate(hello_url, product.big_item, sample, args.warm_up, args)
            loads[name] = timed(
                name, hello_url, product.big_item, sample, args, {"server": process.pid}
            )
    ceiling = loads["hello"].per_second or 1_000.0

    def run(name: str, item_id: int, shape: Shape = PURCHASE) -> tuple[Load, Load]:
        # Buyers for the warm-up from the hello's rate (a ceiling), for the timed part from the
        # warm-up's, with room to spare: no request is sent twice.
        warmed = Load()
        if args.warm_up:
            count = max(MIN_POOL, int(ceiling * args.warm_up * 1.2))
            warm = product.requests(item_id, count, f"{name}-warm", shape)
            warmed = generate(product.url, item_id, warm, args.warm_up, args)
            print(f"{name} warm-up: {warmed.per_second:,.0f} req/s", flush=True)
        rate = warmed.per_second or ceiling
        count = max(MIN_POOL, int(rate * args.duration * 2) + 20 * args.connections)
        requests = product.requests(item_id, count, name, shape)
        loads[name] = timed(name, product.url, item_id, requests, args, pids)
        return warmed, loads[name]

    # The item read is one request for all (no buyer): its sample is sent again and again.
    item = Requests(sample.file, ITEM)
    if args.warm_up:
        generate(product.url, product.big_item, item, args.warm_up, args)
    loads["item"] = timed("item", product.url, product.big_item, item, args, pids)
    run("ticket", product.big_item, TICKET)
    warmed, load = run("purchase", product.big_item)
    found = uvloop.run(
        audit(
            product,
            accepted=warmed.count("202") + load.count("202"),
            reused=warmed.reused + load.reused,
            distinct=warmed.distinct + load.distinct,
        )
    )
    found["soldout_bought_out"] = uvloop.run(buy_out(product))
    run("soldout", product.soldout_item)
    return found


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.serve_hello:
        serve_hello(args.serve_hello, args.port, args.workers, args.server)
        return
    print(f"{args.server}, generator {args.generator}, {args.connections} connections, "
          f"{args.workers} worker process, {args.duration:g} s timed after {args.warm_up:g} s "
          f"of warm-up, {os.cpu_count()} CPUs shared by generator and servers",
          flush=True)  # fmt: skip
    loads: dict[str, Load] = {}
    with tempfile.TemporaryDirectory(prefix="seckill-http-") as tmp:
        workdir = Path(tmp)
        with durable_redis(args.redis_server, workdir / "redis") as redis:
            database_url = args.database_url or f"sqlite+aiosqlite:///{workdir / 'seckill.db'}"
            env = child_env(
                seckill_settings(
                    workdir / "seckill", redis_url=redis.url, database_url=database_url,
                    concurrency=args.connections,
                )
            )  # fmt: skip
            upgrade_database(env, workdir)
            port = free_port()
            api_argv = seckill_command("api", "--host", "127.0.0.1", "--port", str(port))
            api_argv += ["--workers", str(args.workers), "--server", args.server]
            with (
                serving(api_argv, port=port, env=env, cwd=workdir, log=workdir / "api.log") as api,
                running(
                    seckill_command("worker", "persister"), env=env, cwd=workdir,
                    log=workdir / "persister.log",
                ) as persister,
            ):  # fmt: skip
                product = Product(
                    url=f"http://127.0.0.1:{port}", who=credentials(), workdir=workdir,
                    concurrency=args.connections,
                )  # fmt: skip
                uvloop.run(product.set_up())
                found = measure(args, product, loads, pids={
                    "server": api.pid, "redis": redis.process.pid if redis.process else None,
                    "persister": persister.pid,
                })  # fmt: skip
    report(loads, {"hello": "200", "hello raw": "200", "hello rsgi": "200", "item": "200",
                   "ticket": "200", "purchase": "202", "soldout": "409 sold_out"})  # fmt: skip
    verdict = "passed" if found["passed"] else "FAILED"
    print(f"\naudit {verdict}: {json.dumps(found)}")
    for name in ("ticket", "purchase", "soldout"):  # the others reuse their sample on purpose
        if loads[name].reused:
            print(f"note: {name} ran out of prepared buyers; {loads[name].reused} sent again")

    def ratio(load: str, floor: str = "hello raw") -> float:
        ceiling = loads[floor].per_second
        return round(loads[load].per_second / ceiling, 3) if ceiling else 0.0

    def us_per_request(load: str, process: str) -> float:
        rate = loads[load].per_second
        return round(loads[load].cpu.get(process, 0.0) / rate * 1e6, 1) if rate else 0.0

    def cpu_ratio(load: str) -> float:
        bare = us_per_request("hello raw", "server")
        return round(us_per_request(load, "server") / bare, 2) if bare else 0.0

    ticket, purchase = loads["ticket"].per_second, loads["purchase"].per_second
    api_per_purchase = us_per_request("purchase", "server")
    persister_per_purchase = us_per_request("purchase", "persister")
    journey = 1 / (1 / ticket + 1 / purchase) if ticket and purchase else 0.0
    products = ("item", "ticket", "purchase", "soldout")
    summary = {
        # The headline: each buyer route against the bare server's hello, the floor of the
        # server alone (the routes run ahead of the framework).
        "vs_bare_hello": {name: ratio(name) for name in products},
        # A buyer's journey, one ticket then one purchase, at the rates measured.
        "journey_buyers_per_s": round(journey, 1),
        "rps": {name: round(load.per_second, 1) for name, load in loads.items()},
        "p99_ms": {name: round(load.p99_ms, 2) for name, load in loads.items()},
        "purchase_p50_ms": round(loads["purchase"].p50_ms, 2),
        # CPU of the API process per answer; of redis-server per purchase (with the
        # persister's reads and acknowledgements of the stream, which run meanwhile).
        "api_cpu_us": {name: us_per_request(name, "server") for name in loads},
        # The same over the bare hello's: what a route costs the server beyond its floor.
        "api_cpu_vs_bare": {name: cpu_ratio(name) for name in products},
        "redis_cpu_us_per_purchase": us_per_request("purchase", "redis"),
        "persister_cpu_us_per_purchase": persister_per_purchase,
        "persister_vs_api_cpu_per_purchase": (
            round(persister_per_purchase / api_per_purchase, 2) if api_per_purchase else 0.0
        ),
        # Against the FastAPI hello: what the product costs over the framework it is built on.
        "vs_fastapi_hello": {name: ratio(name, "hello") for name in products},
        # granian's own interface beside ASGI, both bare: what ASGI's messages cost a request.
        "rsgi_vs_bare_hello": ratio("hello rsgi") if "hello rsgi" in loads else None,
        "rsgi_cpu_us": us_per_request("hello rsgi", "server") if "hello rsgi" in loads else None,
        "server": args.server,
        "generator": args.generator,
        "workers": args.workers,
        "connections": args.connections,
        "duration_s": args.duration,
        "audit": found,
    }
    print(json.dumps(summary))
    if not found["passed"]:
        sys.exit(1)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit("interrupted")  # the servers were stopped on the way out
