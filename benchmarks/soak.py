"""The fault soak: a sale of a few minutes on seckill's own processes while everything under it
fails, then verdicts, and figures for each kind of fault.

    python -m benchmarks.soak [--small] [--seconds 150] [--stock 3000] [--shards 4] [--rate 40]

The deployment: a Redis Cluster of 3 masters with a replica each (AOF, fsync every second, the
``fast`` durability), PostgreSQL (a database of its own on SECKILL_TEST_POSTGRES_URL's server,
reached through a proxy that can cut it), a NATS server of its own with JetStream, and as
separate processes two APIs, two persisters, a reaper, a reconciler and a bridge. Buyers
arrive at a steady rate, each with one unit to buy (some try a second purchase, which the
per-buyer limit refuses); they pay, cancel or let their hold run out, and they retry what got
no answer (or a 503) with the same idempotency key or payment id, on the other API if theirs
is gone. Demand is well above the stock.

Meanwhile, at random moments: persisters killed (SIGKILL) and started again, Redis masters
killed (their replicas take over; the old master returns as a replica), a replica killed, the
reaper, the bridge and an API killed and started again, the broker killed and started again,
SQL cut for a while, and one master rewound: killed and started again on a copy of its AOF
taken seconds earlier (a host crash inside the fsync window), its replica kept from taking over.
A process that exits on its own (a worker started while its Redis node is down exits) is
started again, as systemd or a pod's restart policy would, and counted (``exited``).

Then the faults stop, buyers go on until the stock is gone, and the verdicts: no oversell, no
buyer above the limit, no undersell, every 202 landed once (or lost with writes Redis lost
before they landed, at a rewind or a failover, counted: the one loss ``fast`` allows), every
`paid` answer still paid (no exception: a notice is answered once SQL has it), every charge
a sale of its order's sum or a refund owed of the sum charged, every event
delivered to the broker once after dedup and none that SQL's journal lacks, Redis == SQL, the
audit passes, every request answered within a minute of retries, no server error (a 5xx other
than 503). Exit code 0 when every verdict passes; on a failure the processes' logs are kept.
The last line printed is one JSON object of the run's figures, ``paid_lost`` (answers `paid`
whose order is not paid in SQL) and ``phantom_messages`` (messages whose event SQL's journal
lacks) among them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import nats
import redis
from nats.js.api import ConsumerConfig, DeliverPolicy
from redis.crc import key_slot
from rich.console import Console
from rich.table import Table
from sqlalchemy import func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from benchmarks.tcp_proxy import TcpProxy
from seckill.bootstrap.keys import crowd_credentials
from seckill.bootstrap.runtime import open_runtime
from seckill.config import Settings
from seckill.crowd.client import ApiClient, Reply
from seckill.domain.events import stream_position
from seckill.domain.money import Charge, Money, account
from seckill.domain.orders import OrderStatus
from seckill.engine.group_registry import registered_groups
from seckill.engine.keys import DEFAULT_PREFIX, item_keys
from seckill.engine.streams import GROUP
from seckill.redis_cluster import LocalCluster, free_cluster_port
from seckill.redis_server import die_with_parent
from seckill.services.reconcile.records import audit_records
from seckill.sinks.base import bridge_group
from seckill.sinks.messages import forwarded, message_id
from seckill.sinks.nats import DEFAULT_STREAM, DEFAULT_SUBJECT_PREFIX
from seckill.store.tables import Order, Refund, StockFlow

POSTGRES_URL = os.environ.get(
    "SECKILL_TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
)
NATS_SERVER = shutil.which("nats-server") or "nats-server"
START_LIMIT_S = 60.0
CROWD_CONNECTIONS = 800  # at most, to both APIs: about the buyers in flight at the worst
GIVE_UP_S = 60.0  # a buyer's request still without a final answer by then counts as unanswered
# A provider retries a notice answered 503 for hours (Retry-After): here, through the settling.
PROVIDER_GIVE_UP_S = 300.0
SETTLE_LIMIT_S = 180.0  # after the faults: for the stock to sell out and SQL to agree
NODE_TIMEOUT_MS = 1_500  # a master unreachable this long is replaced by its replica
AOF_NAMES = ("appendonlydir", "appendonly.aof")  # Redis 7's directory of files; 6.2's one file
REWIND_S = 3.0  # how far back the rewound master goes (its AOF copy's age)
LOSS_WINDOW_S = REWIND_S + 1.5  # a 202 answered this long before a loss may be lost with it
# A unit's price, in a currency other than the default: every notice must name it.
PRICE = Money(100, "EUR")


@dataclass(frozen=True, slots=True)
class Knobs:
    seconds: float = 150.0  # the faults' window (buying starts before and goes on after)
    stock: int = 3_000  # sells out near the end of the faults' window
    shards: int = 4
    rate: float = 40.0  # buyers arriving per second
    hold_seconds: int = 4
    persister_kills: int = 100
    failovers: int = 5
    replica_kills: int = 2
    reaper_kills: int = 3
    bridge_kills: int = 20
    broker_outages: int = 2
    api_kills: int = 2
    sql_cut_s: float = 12.0
    rewind: bool = True
    seed: int = 7

    @classmethod
    def small(cls) -> Knobs:
        """The run the test suite makes: every fault, fewer times, in under two minutes."""
        return cls(
            seconds=25.0, stock=320, rate=25.0, persister_kills=12, failovers=2,
            replica_kills=1, reaper_kills=1, bridge_kills=4, broker_outages=1, api_kills=1,
            sql_cut_s=6.0,
        )  # fmt: skip


# -- the deployment --------------------------------------------------------------------------


@dataclass(slots=True)
class Process:
    """One of seckill's processes, killed and started again at will."""

    name: str
    argv: list[str]
    env: Callable[[], dict[str, str]]  # read at each start: a Redis node may be gone since
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    held_down: bool = False  # killed by a fault, started again by it: not the supervisor's

    @property
    def exited(self) -> bool:
        """It ended on its own (a worker exits when Redis is unreachable as it starts)."""
        return not self.held_down and self.popen is not None and self.popen.poll() is not None

    def start(self) -> None:
        self.held_down = False
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv, env=self.env(), stdout=out, stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,
            )  # fmt: skip

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass(slots=True)
class NatsServer:
    """A NATS server with JetStream on its own port and directory (killed by the soak)."""

    port: int
    directory: Path
    popen: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        argv = [NATS_SERVER, "-a", "127.0.0.1", "-p", str(self.port), "-js",
                "-sd", str(self.directory)]  # fmt: skip
        self.popen = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent
        )

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()


def through_proxy(url: str, database: str, port: int) -> str:
    """``url`` (SQLAlchemy's) for ``database``, reached through the proxy on ``port``."""
    return (
        make_url(url)
        .set(host="127.0.0.1", port=port, database=database)
        .render_as_string(hide_password=False)
    )


@contextlib.asynccontextmanager
async def scratch_database() -> Any:
    """A database of the soak's own on the PostgreSQL server, dropped at the end."""
    name = f"seckill_soak_{os.getpid()}_{random.randrange(1 << 32):08x}"
    admin = create_async_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            await conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield name
    finally:
        async with admin.connect() as conn:
            await conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        await admin.dispose()


class Deployment:
    """Everything the soak runs, started in order, stopped all at once."""

    def __init__(
        self, scratch: Path, logs: Path, cluster: LocalCluster, proxy: TcpProxy, database: str
    ) -> None:
        self.scratch = scratch
        self.cluster = cluster
        self.proxy = proxy
        self.nats = NatsServer(free_cluster_port(), scratch / "nats")
        sql_port = urlsplit(POSTGRES_URL).port
        assert sql_port == proxy.target_port, "the proxy stands before the SQL server"
        self.fixed_env = {k: v for k, v in os.environ.items() if not k.startswith("SECKILL_")} | {
            "SECKILL_REDIS_CLUSTER": "true",
            "SECKILL_DATABASE_URL": through_proxy(POSTGRES_URL, database, proxy.port),
            "SECKILL_DATA_DIR": str(scratch / "data"),
            "SECKILL_BRIDGE_URL": self.nats.url,
            "SECKILL_TICKET_TTL_SECONDS": "600",
            "SECKILL_RATE_LIMIT_REQUESTS": "1000",
            "SECKILL_REAPER_INTERVAL_SECONDS": "0.2",
            "SECKILL_RECONCILE_INTERVAL_SECONDS": "2",
            "SECKILL_LOG_LEVEL": "WARNING",
        }
        self.api_ports = [free_cluster_port(), free_cluster_port()]
        cli = [sys.executable, "-m", "seckill.cli"]

        def process(name: str, *args: str) -> Process:
            return Process(name, [*cli, *args], self.env, logs / f"{name}.log")

        self.apis = [
            process(f"api-{n}", "api", "--server", "uvicorn", "--port", str(port))
            for n, port in enumerate(self.api_ports)
        ]
        persister = ("worker", "persister", "--claim-idle-ms", "2000")
        self.persisters = [process(f"persister-{n}", *persister) for n in range(2)]
        self.reaper = process("reaper", "worker", "reaper")
        self.reconciler = process("reconciler", "worker", "reconciler")
        self.bridge = process("bridge", "worker", "bridge")

    @property
    def processes(self) -> list[Process]:
        return [*self.apis, *self.persisters, self.reaper, self.reconciler, self.bridge]

    def env(self) -> dict[str, str]:
        """The processes' environment, with a Redis node that is up now (a cluster client
        learns every other node from it)."""
        port = self.cluster.primary_ports()[0]
        return self.fixed_env | {"SECKILL_REDIS_URL": f"redis://127.0.0.1:{port}"}

    def settings(self) -> Settings:
        ours = {k: v for k, v in self.env().items() if k.startswith("SECKILL_")}
        return Settings.model_validate(
            {k.removeprefix("SECKILL_").lower(): v for k, v in ours.items()}
        )

    async def start(self) -> None:
        (self.scratch / "nats").mkdir()
        self.nats.start()
        upgrade = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "seckill.cli", "db", "upgrade"],
            env=self.env(), capture_output=True, text=True,
        )  # fmt: skip
        if upgrade.returncode:
            raise RuntimeError(f"seckill db upgrade failed: {upgrade.stdout}{upgrade.stderr}")
        for p in self.processes:
            p.start()

    async def stop(self) -> None:
        """Every process told to stop at the same time, each waited for in a thread: the SQL
        proxy relays on this loop, and a worker closing its SQL connections as it exits waits
        for PostgreSQL's answer through it (a loop blocked in ``wait()`` left each SQL worker
        its full 15 s, then SIGKILL)."""
        await asyncio.gather(*(asyncio.to_thread(p.stop) for p in self.processes))
        self.nats.kill()


# -- the buyers ------------------------------------------------------------------------------


@dataclass(slots=True)
class Sold:
    """An order a buyer was answered 202 for, and what it was told since."""

    order_id: str
    buyer: str
    sent_at: float  # the purchase's last try: a Redis that lost its write had it before this
    answered_at: float
    paid_at: float | None = None  # when a payment notice was answered `paid`
    released: bool = False  # a cancel was answered released


@dataclass(slots=True)
class Record:
    """What the buyers sent and were told. Times: seconds since the soak started."""

    started: float = field(default_factory=time.monotonic)
    started_ms: int = field(default_factory=lambda: time.time_ns() // 1_000_000)  # wall clock
    sold: dict[str, Sold] = field(default_factory=dict)
    outcomes: Counter[str] = field(default_factory=Counter)  # (action outcome) of final answers
    # Every 503 and no answer: when, the outcome, the action, and which API was asked.
    unavailable: list[tuple[float, str, str, int]] = field(default_factory=list)
    unanswered: list[str] = field(default_factory=list)
    server_errors: list[str] = field(default_factory=list)  # answers 5xx other than 503
    charges: dict[str, Charge] = field(default_factory=dict)  # answered 200, by payment id
    buyers: int = 0
    second_tries: int = 0

    def now(self) -> float:
        return time.monotonic() - self.started

    def unavailable_outcomes(self) -> Counter[str]:
        """How many 503s and no answers each outcome had, most first."""
        return Counter(outcome for _, outcome, _, _ in self.unavailable)

    def written_at(self, entry_id: str) -> float:
        """When a stream entry was written, by its id's time."""
        return (stream_position(entry_id)[0] - self.started_ms) / 1000


class Buyers:
    # Answers after which a buyer tries the other API: none at all (its API is gone). A 503
    # is tried again on the same one (a node failing over, SQL cut: the other would say 503 too).
    other_api_after: frozenset[int] = frozenset({0})

    def __init__(self, clients: list[ApiClient], item_id: int, record: Record, rng: random.Random):
        self.clients = clients
        self.item_id = item_id
        self.record = record
        self.rng = rng
        self.paying_only = False

    async def send(
        self, action: str, call: Callable[[ApiClient], Awaitable[Reply]], *,
        patience_s: float = GIVE_UP_S,
    ) -> Reply:  # fmt: skip
        """``call`` until it has an answer that is not 503 (the same request each time, on the
        other API after no answer), for at most ``patience_s``."""
        record, turn = self.record, self.rng.randrange(2)
        give_up = time.monotonic() + patience_s
        while True:
            reply = await call(self.clients[turn % 2])
            if reply.status not in (0, 503):
                record.outcomes[f"{action} {reply.outcome}"] += 1
                if reply.status >= 500:
                    record.server_errors.append(f"{action} {reply.status} {reply.body}")
                return reply
            record.unavailable.append((record.now(), reply.outcome, action, turn % 2))
            if time.monotonic() > give_up:
                record.unanswered.append(action)
                return reply
            if reply.status in self.other_api_after:
                turn += 1
            await asyncio.sleep(0.1 + self.rng.random() * 0.2)

    async def journey(self, name: str) -> None:
        item, record = self.item_id, self.record
        record.buyers += 1
        issued = await self.send("ticket", lambda c: c.ticket(item, name))
        if issued.status != 200:
            return
        ticket = str(issued.body["ticket"])

        sent_at = 0.0

        def buy(key: str) -> Callable[[ApiClient], Awaitable[Reply]]:
            async def attempt(client: ApiClient) -> Reply:
                nonlocal sent_at
                sent_at = record.now()
                return await client.buy(item, name, ticket=ticket, key=key, quantity=1)

            return attempt

        held = await self.send("buy", buy(f"{name}-1"))
        if held.status != 202:
            return
        sold = record.sold[str(held.body["order_id"])] = Sold(
            str(held.body["order_id"]), name, sent_at, record.now()
        )
        if self.rng.random() < 0.2:  # a second purchase, another key: the limit is 1
            record.second_tries += 1
            await self.send("second buy", buy(f"{name}-2"))
        fate = 0.0 if self.paying_only else self.rng.random()
        if fate < 0.6:
            payment_id = f"pay-{sold.order_id}"
            paid = await self.send(
                "pay",
                lambda c: c.notify_payment(
                    item, sold.order_id, payment_id=payment_id, succeeded=True, amount=PRICE
                ),
                patience_s=PROVIDER_GIVE_UP_S,
            )
            if paid.status == 200:
                refund = paid.body["outcome"] == OrderStatus.REFUND_REQUIRED
                record.charges[payment_id] = Charge(
                    payment_id, int(sold.order_id), refund, paid.body.get("refund_reason"), PRICE
                )
            if paid.status == 200 and paid.body.get("order_status") == OrderStatus.PAID:
                sold.paid_at = record.now()
        elif fate < 0.7:
            cancelled = await self.send("cancel", lambda c: c.cancel(name, item, sold.order_id))
            sold.released = cancelled.status == 200
        # else: the hold runs out

    async def arrive(self, rate: float, until: Callable[[], bool], prefix: str) -> None:
        """Buyers at ``rate`` per second until ``until()``; waits for every journey."""
        journeys: set[asyncio.Task[None]] = set()
        n = 0
        while not until():
            task = asyncio.create_task(self.journey(f"{prefix}{n}"))
            journeys.add(task)
            task.add_done_callback(journeys.discard)
            n += 1
            await asyncio.sleep(self.rng.expovariate(rate))
        await asyncio.gather(*journeys)


async def until(done: Callable[[], Awaitable[bool]], *, limit_s: float) -> bool:
    """Poll ``done`` every 0.1 s; False if it is still not done after ``limit_s``."""
    give_up = time.monotonic() + limit_s
    while not await done():
        if time.monotonic() > give_up:
            return False
        await asyncio.sleep(0.1)
    return True


# -- the faults ------------------------------------------------------------------------------


@dataclass(slots=True)
class Fault:
    kind: str
    at: float
    figures: dict[str, float] = field(default_factory=dict)


class Chaos:
    """Each kind of fault at random moments of the window; Redis's one at a time (two masters
    down together would leave slots with no owner, which is not the fault under test)."""

    def __init__(
        self, deployment: Deployment, knobs: Knobs, record: Record, rng: random.Random,
        item_id: int,
    ) -> None:  # fmt: skip
        self.d = deployment
        self.knobs = knobs
        self.record = record
        self.rng = rng
        self.item_id = item_id
        self.faults: list[Fault] = []
        self.redis_turn = asyncio.Lock()
        self.start_s = 5.0
        self.end_s = 5.0 + knobs.seconds

    def moments(self, times: int) -> Iterator[float]:
        yield from sorted(self.rng.uniform(self.start_s, self.end_s - 5) for _ in range(times))

    async def at_moments(self, times: int, action: Callable[[], Awaitable[None]]) -> None:
        for moment in self.moments(times):
            await asyncio.sleep(max(0.0, moment - self.record.now()))
            await action()

    def noted(self, kind: str, **figures: float) -> Fault:
        fault = Fault(kind, self.record.now(), dict(figures))
        self.faults.append(fault)
        return fault

    async def run(self) -> None:
        k = self.knobs
        tasks = [
            self.at_moments(k.persister_kills, self.kill_persister),
            self.at_moments(k.failovers, self.fail_over),
            self.at_moments(k.replica_kills, self.kill_replica),
            self.at_moments(k.reaper_kills, lambda: self.restart(self.d.reaper, "reaper")),
            self.at_moments(k.bridge_kills, lambda: self.restart(self.d.bridge, "bridge")),
            self.at_moments(k.broker_outages, self.broker_outage),
            self.at_moments(k.api_kills, self.kill_api),
            self.at_moments(1, self.cut_sql),
        ]
        if k.rewind:
            tasks.append(self.at_moments(1, self.rewind))
        await asyncio.gather(*tasks)

    async def restart(self, process: Process, kind: str, *, down_s: float = 0.0) -> None:
        process.held_down = True
        await asyncio.to_thread(process.kill)
        self.noted(kind)
        await asyncio.sleep(down_s)
        process.start()

    async def supervise(self) -> None:
        """What systemd's ``Restart=always`` or a pod's restart policy does: a process that
        exited is started again (each one noted as a fault of its own, ``exited``)."""
        while True:
            for process in self.d.processes:
                if process.exited:
                    self.noted("exited")
                    process.start()
            await asyncio.sleep(0.5)

    async def kill_persister(self) -> None:
        await self.restart(self.rng.choice(self.d.persisters), "persister")

    async def kill_api(self) -> None:
        await self.restart(self.rng.choice(self.d.apis), "api", down_s=2.0)

    async def broker_outage(self) -> None:
        await asyncio.to_thread(self.d.nats.kill)
        self.noted("broker", down_s=5.0)
        await asyncio.sleep(5.0)
        self.d.nats.start()

    async def cut_sql(self) -> None:
        self.d.proxy.cut()
        fault = self.noted("sql", down_s=self.knobs.sql_cut_s)
        await asyncio.sleep(self.knobs.sql_cut_s)
        self.d.proxy.restore()
        fault.figures["sold_while_down"] = sum(
            1 for s in self.record.sold.values() if s.answered_at >= fault.at
            and s.answered_at <= fault.at + self.knobs.sql_cut_s
        )  # fmt: skip

    async def selling(self) -> bool:
        """A 202 was answered within the last second."""
        now = self.record.now()
        return any(now - s.answered_at < 1 for s in list(self.record.sold.values())[-50:])

    async def primaries(self) -> list[int]:
        return await asyncio.to_thread(self.d.cluster.primary_ports)

    async def primaries_are(self, count: int) -> bool:
        return len(await self.primaries()) == count

    async def fail_over(self) -> None:
        async with self.redis_turn:
            port = self.rng.choice(await self.primaries())
            node = self.d.cluster.node_at(port)
            started = time.monotonic()
            await asyncio.to_thread(node.kill)
            fault = self.noted("master")
            await until(lambda: self.primaries_are(3), limit_s=60)
            fault.figures["failover_s"] = time.monotonic() - started
            await asyncio.to_thread(node.start)  # back as a replica of the one promoted
            await self.replicas_in_sync()

    async def replicas_in_sync(self) -> None:
        """Wait until every master has a replica again (a fault taken on a lone master would
        be two faults)."""
        give_up = time.monotonic() + 60
        while time.monotonic() < give_up:
            roles = await asyncio.to_thread(self.roles)
            if sum(1 for r in roles.values() if r[0] == "slave" and r[3] == "connected") == 3:
                return
            await asyncio.sleep(0.2)

    def roles(self) -> dict[int, list[Any]]:
        found = {}
        for node in self.d.cluster.nodes:
            if node.process is None or node.port is None:
                continue
            with redis.Redis(port=node.port, decode_responses=True) as client:
                found[node.port] = client.execute_command("ROLE")
        return found

    async def kill_replica(self) -> None:
        async with self.redis_turn:
            replicas = [p for p, r in (await asyncio.to_thread(self.roles)).items()
                        if r[0] == "slave"]  # fmt: skip
            node = self.d.cluster.node_at(self.rng.choice(replicas))
            await asyncio.to_thread(node.kill)
            self.noted("replica")
            await asyncio.sleep(1.0)
            await asyncio.to_thread(node.start)
            await self.replicas_in_sync()

    async def rewind(self) -> None:
        """The master of the item's head, crashed inside its fsync window: started again on its
        AOF as it was ``REWIND_S`` earlier. Its replica is kept from taking over meanwhile, and
        then copies the rewound master."""
        async with self.redis_turn:
            slot = key_slot(item_keys(self.item_id, DEFAULT_PREFIX).item.encode())
            roles = await asyncio.to_thread(self.roles)
            port = await asyncio.to_thread(slot_owner, self.d.cluster, slot)
            replica = next(p for p, r in roles.items() if r[0] == "slave" and int(r[2]) == port)
            node = self.d.cluster.node_at(port)
            assert node.directory is not None
            aof = next(node.directory / name for name in AOF_NAMES
                       if (node.directory / name).exists())  # fmt: skip
            copy = self.d.scratch / "rewind" / aof.name
            with redis.Redis(port=replica) as follower:
                follower.config_set("cluster-replica-no-failover", "yes")
            await until(self.selling, limit_s=20)  # a rewind of a quiet moment loses nothing
            await asyncio.to_thread(copy_path, aof, copy)
            copied = self.record.now()
            await asyncio.sleep(REWIND_S)
            await asyncio.to_thread(node.kill)
            fault = self.noted("rewind", rewound_s=self.record.now() - copied)
            remove_path(aof)
            copy_path(copy, aof)
            await asyncio.to_thread(node.start)
            with redis.Redis(port=replica) as follower:
                follower.config_set("cluster-replica-no-failover", "no")
            fault.figures["sold_in_window"] = sum(
                1 for s in self.record.sold.values() if copied <= s.answered_at <= fault.at
            )
            await self.replicas_in_sync()


def copy_path(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copy2(source, target)


def remove_path(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()


def slot_owner(cluster: LocalCluster, slot: int) -> int:
    for port in cluster.primary_ports():
        with redis.Redis(port=port, decode_responses=True) as client:
            for start, end, owner, *_ in client.execute_command("CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    return int(owner[1])
    raise RuntimeError(f"no node serves slot {slot}")


# -- the verdicts ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    name: str
    ok: bool
    detail: str


async def delivered_events(url: str) -> tuple[dict[str, tuple[str, str]], int]:
    """Every message on the bridge's stream, by message id: (order id, event); and how many
    copies carried a message id already seen."""
    client = await nats.connect(url, connect_timeout=5)
    try:
        jetstream = client.jetstream()
        try:
            await jetstream.stream_info(DEFAULT_STREAM)
        except nats.js.errors.NotFoundError:  # the bridge never published
            return {}, 0
        reader = await jetstream.pull_subscribe(
            f"{DEFAULT_SUBJECT_PREFIX}.>", stream=DEFAULT_STREAM,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
        )  # fmt: skip
        seen: dict[str, tuple[str, str]] = {}
        copies = 0
        while True:
            try:
                batch = await reader.fetch(500, timeout=2)
            except TimeoutError:  # nothing more (nats-py raises its own, or asyncio's)
                return seen, copies
            for message in batch:
                await message.ack()
                mid = (message.headers or {}).get("Nats-Msg-Id", "")
                body = json.loads(message.data)
                if mid in seen:
                    copies += 1
                seen[mid] = (str(body["order_id"]), str(body["event"]))
    finally:
        await client.close()


def tally(rows: Sequence[Any]) -> tuple[dict[str, Any], int, int, Counter[str], list[str]]:
    """An item's order rows (id, buyer, quantity, status) as the verdicts read them: the rows
    by order id, the units sold and held, the units each buyer holds or paid, and the buyers
    above one unit."""
    orders = {str(r.id): r for r in rows}
    live = [r for r in rows if r.status in (OrderStatus.HELD, OrderStatus.PAID)]
    sold_units = sum(r.quantity for r in rows if r.status == OrderStatus.PAID)
    held_units = sum(r.quantity for r in live if r.status == OrderStatus.HELD)
    per_buyer = Counter[str]()
    for r in live:
        per_buyer[r.buyer] += r.quantity
    over = [b for b, units in per_buyer.items() if units > 1]
    return orders, sold_units, held_units, per_buyer, over


@dataclass(frozen=True, slots=True)
class Findings:
    verdicts: list[Verdict]
    figures: dict[str, int]  # the run's counts, printed as its last line (JSON)


async def verdicts(
    deployment: Deployment, item_id: int, knobs: Knobs, record: Record, faults: list[Fault]
) -> Findings:
    losses = [f.at for f in faults if f.kind in ("rewind", "master")]
    async with open_runtime(deployment.settings()) as runtime:
        engine, ledger = runtime.engine, runtime.ledger
        checks = await audit_records(engine, ledger, item_id)
        stock = await engine.stock(item_id)
        async with ledger.engine.connect() as conn:
            rows = (await conn.execute(
                select(Order.id, Order.buyer, Order.quantity, Order.status, Order.payment_id)
                .where(Order.item_id == item_id)
            )).all()  # fmt: skip
            refunds = (await conn.execute(
                select(Refund.payment_id, Refund.order_id, Refund.amount_cents, Refund.currency)
                .where(Refund.item_id == item_id)
            )).all()  # fmt: skip
            # Every order event the bridge publishes (sinks.messages.forwarded).
            journal = [
                row
                for row in await conn.execute(
                    select(StockFlow.order_id, StockFlow.event, StockFlow.shard,
                           StockFlow.event_id, StockFlow.reason)
                    .where(StockFlow.item_id == item_id, StockFlow.order_id.is_not(None))
                )
                if forwarded(row.event, row.reason)
            ]  # fmt: skip
            copies_in_sql = (await conn.execute(
                select(func.count()).select_from(Order).where(Order.item_id == item_id)
            )).scalar_one()  # fmt: skip
    orders, sold_units, held_units, per_buyer, over = tally(rows)

    def lost_with_redis(sold: Sold) -> bool:
        """Sent before Redis lost writes and answered shortly before (the ``fast`` durability's
        loss). The answer may reach the buyer after the loss: Redis wrote it before."""
        return any(sold.sent_at <= at and at - sold.answered_at <= LOSS_WINDOW_S for at in losses)

    lost = [s for s in record.sold.values() if s.order_id not in orders]
    unexplained = [s for s in lost if not lost_with_redis(s)]
    told_paid = [s for s in record.sold.values() if s.paid_at is not None]
    unpaid = [
        s.order_id for s in told_paid
        if s.order_id not in orders or orders[s.order_id].status != OrderStatus.PAID
    ]  # fmt: skip
    delivered, copies = await delivered_events(deployment.nats.url)
    wanted = {(str(r.order_id), str(r.event)) for r in journal}
    journaled = {
        message_id(item_keys(item_id, DEFAULT_PREFIX, shard=r.shard).events, r.event_id)
        for r in journal
    }
    # A message of an event SQL never journaled: published before SQL had it, of a write Redis
    # then lost. The bridge publishes only what SQL landed, so there is none.
    phantoms = [mid for mid in delivered if mid not in journaled]
    got = Counter(event for mid, event in delivered.items() if mid in journaled)
    missing = wanted - set(got)
    entry_at = {(str(r.order_id), str(r.event)): record.written_at(r.event_id) for r in journal}
    shown_missing = sorted(missing, key=lambda event: entry_at[event])[:3]
    twice = [f"{kind} of {order}" for (order, kind), n in got.items() if n > 1]
    failed_checks = [f"{c.name}: {c.detail}" for c in checks if not c.ok]
    accounts = account(
        record.charges.values(),
        paid_by={int(r.id): r.payment_id for r in rows if r.status == OrderStatus.PAID},
        refunds={r.payment_id: r.order_id for r in refunds},
        order_sums={int(r.id): PRICE.times(r.quantity) for r in rows},
        refund_sums={r.payment_id: Money(r.amount_cents, r.currency) for r in refunds},
    )
    redis_side = f"Redis {stock.available}/{stock.held}/{stock.sold}" if stock else "Redis gone"
    found = [
        Verdict("no oversell", sold_units + held_units <= knobs.stock,
                f"SQL sold {sold_units} + held {held_units} of {knobs.stock}; {redis_side} "
                "(available/held/sold)"),
        Verdict("no buyer above the limit", not over,
                f"{len(per_buyer)} buyers hold or paid; {len(over)} above 1 "
                f"({record.second_tries} tried a second purchase)"),
        Verdict("no undersell",
                sold_units == knobs.stock and stock is not None and stock.available == 0,
                f"sold {sold_units} of {knobs.stock}, demand {record.buyers} buyers"),
        Verdict("every 202 landed once", not unexplained and copies_in_sql == len(orders),
                f"{len(record.sold)} answered 202; {len(lost) - len(unexplained)} lost with "
                "writes Redis lost "
                f"before they landed (sent before a rewind or a failover, answered at most "
                f"{LOSS_WINDOW_S:.1f} s before it); {len(unexplained)} lost otherwise"
                + "".join(f"; order {s.order_id} of {s.buyer} sent at {s.sent_at:.1f} s, "
                          f"answered at {s.answered_at:.1f} s" for s in unexplained[:3])),
        Verdict("every paid answer still paid", not unpaid,
                f"{len(told_paid)} answered paid; {len(unpaid)} not paid in SQL"
                + "".join(f"; order {o} is {orders[o].status if o in orders else 'gone'}"
                          for o in unpaid[:3])),
        Verdict("every charge accounted for", accounts.balanced,
                f"{len(record.charges)} charges answered; {accounts.summary()}"),
        Verdict("every event delivered once after dedup",
                not missing and not twice and not phantoms,
                f"{len(wanted)} order events in SQL's journal; {len(delivered)} messages "
                f"({copies} copies dropped by id); {len(missing)} missing, {len(twice)} "
                f"delivered under two ids, {len(phantoms)} of events SQL lacks"
                + "".join(f"; {t}" for t in twice[:3])
                + "".join(f"; {mid} not in SQL" for mid in phantoms[:3])
                + "".join(f"; {kind} of {order} missing (written at {entry_at[order, kind]:.1f} s)"
                          for order, kind in shown_missing)),
        Verdict("Redis == SQL, the audit passes", not failed_checks,
                "; ".join(failed_checks[:4]) or f"{len(checks)} checks pass"),
        Verdict("every request answered", not record.unanswered,
                f"{len(record.unanswered)} gave up after 503s ({GIVE_UP_S:.0f} s for a buyer, "
                f"{PROVIDER_GIVE_UP_S:.0f} s for the provider)"
                + "".join(f"; {action}" for action in sorted(set(record.unanswered)))),
        Verdict("no server error", not record.server_errors,
                f"{len(record.server_errors)} answers 5xx other than 503"
                + "".join(f"; {error[:150]}" for error in record.server_errors[:2])),
    ]  # fmt: skip
    figures = {
        "answered_202": len(record.sold), "lost_202": len(lost),
        "answered_paid": len(told_paid), "paid_lost": len(unpaid),
        "order_events": len(wanted), "messages": len(delivered),
        "phantom_messages": len(phantoms), "missing_messages": len(missing),
        "verdicts_failed": sum(not v.ok for v in found),
    }  # fmt: skip
    return Findings(found, figures)


# -- the run ---------------------------------------------------------------------------------


async def settled(client: ApiClient, item_id: int) -> dict[str, Any] | None:
    answer = await client.counters(item_id)
    return answer.body if answer.status == 200 else None


async def wait_settled(
    clients: list[ApiClient], buyers: Buyers, item_id: int, settings: Settings, console: Console
) -> float:
    """Buyers who pay keep coming until no unit is left or held; then until SQL agrees.
    Returns the seconds SQL took to agree after the last request."""
    give_up = time.monotonic() + SETTLE_LIMIT_S
    buyers.paying_only = True
    sold_out = asyncio.Event()

    async def watch() -> None:
        shown = 0.0
        while time.monotonic() < give_up:
            seen = await settled(clients[0], item_id) or await settled(clients[1], item_id)
            redis_side = (seen or {}).get("redis") or {}
            if redis_side.get("available") == 0 and redis_side.get("held") == 0:
                sold_out.set()
                return
            if time.monotonic() - shown > 10:
                shown = time.monotonic()
                console.print(f"  selling out: Redis {redis_side}")
            await asyncio.sleep(0.5)
        sold_out.set()

    await asyncio.gather(watch(), buyers.arrive(10.0, sold_out.is_set, "closing-"))
    last_request = time.monotonic()
    async with open_runtime(settings) as runtime:
        shown = time.monotonic()
        while time.monotonic() < give_up:
            checks = await audit_records(runtime.engine, runtime.ledger, item_id)
            if all(c.ok for c in checks):
                break
            if time.monotonic() - shown > 10:
                shown = time.monotonic()
                failing = [f"{c.name}: {c.detail}" for c in checks if not c.ok]
                console.print(f"  settling: {'; '.join(failing)[:300]}")
            await asyncio.sleep(0.5)
    return time.monotonic() - last_request


async def soak(knobs: Knobs, console: Console) -> bool:
    rng = random.Random(knobs.seed)
    with (
        tempfile.TemporaryDirectory(prefix="seckill-soak-") as scratch_dir,
        LocalCluster(masters=3, replicas=1, appendonly=True, node_timeout_ms=NODE_TIMEOUT_MS,
                     binary=shutil.which("redis-server")) as cluster,
    ):  # fmt: skip
        scratch = Path(scratch_dir)
        target = urlsplit(POSTGRES_URL)
        proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432)
        await proxy.start()
        logs = Path(tempfile.mkdtemp(prefix="seckill-soak-logs-"))
        passed = False
        async with scratch_database() as database:
            deployment = Deployment(scratch, logs, cluster, proxy, database)
            try:
                await deployment.start()
                passed = await sale(deployment, knobs, rng, console)
            finally:
                await deployment.stop()
                await proxy.stop()
                if passed:
                    shutil.rmtree(logs)
                else:
                    console.print(f"the processes' logs are kept in {logs}")
        return passed


async def sale(deployment: Deployment, knobs: Knobs, rng: random.Random, console: Console) -> bool:
    credentials = crowd_credentials(deployment.settings())
    timeout = aiohttp.ClientTimeout(total=10)
    # The crowd is many buyers, each with a connection of its own: the driver's pool must not
    # queue one buyer's request behind another's (aiohttp's default is 100 connections, which
    # notices waiting for SQL through a persister kill fill, and the tickets behind them time
    # out unsent).
    connector = aiohttp.TCPConnector(limit=CROWD_CONNECTIONS)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        clients = [ApiClient(session, f"http://127.0.0.1:{p}", credentials)
                   for p in deployment.api_ports]  # fmt: skip
        await wait_healthy(clients)
        await wait_following(deployment.settings())
        item_id = await put_on_sale(
            clients[0], "soak", stock=knobs.stock, shards=knobs.shards,
            hold_seconds=knobs.hold_seconds,
        )  # fmt: skip
        record = Record()
        buyers = Buyers(clients, item_id, record, rng)
        chaos = Chaos(deployment, knobs, record, rng, item_id)
        console.print(
            f"soak: item {item_id}, {knobs.stock} units over {knobs.shards} shards, "
            f"{knobs.rate:.0f} buyers/s, faults for {knobs.seconds:.0f} s"
        )
        supervisor = asyncio.create_task(chaos.supervise())
        try:
            await asyncio.gather(
                chaos.run(),
                buyers.arrive(knobs.rate, lambda: record.now() > chaos.end_s, "buyer-"),
            )
            console.print(f"faults done at {record.now():.0f} s; selling out and settling")
            agreed_s = await wait_settled(clients, buyers, item_id, deployment.settings(), console)
        finally:
            supervisor.cancel()
    found = await verdicts(deployment, item_id, knobs, record, chaos.faults)
    print_faults(console, chaos.faults, record, agreed_s)
    passed = print_verdicts(console, found.verdicts)
    print(json.dumps(found.figures), flush=True)  # one line, for scripts
    return passed


async def put_on_sale(
    client: ApiClient, name: str, *, stock: int, shards: int, hold_seconds: int
) -> int:
    """An item on sale from now for an hour at ``PRICE``, one unit per buyer, created and
    warmed through the admin API; its id."""
    now = datetime.now(UTC)
    created = await client.request(
        "POST", "/api/v1/admin/items", token=client.credentials.admin(),
        body={"name": name, "price_cents": PRICE.cents, "currency": PRICE.currency, "total": stock,
              "starts_at": now.isoformat(), "ends_at": (now + timedelta(hours=1)).isoformat(),
              "per_buyer_limit": 1, "hold_seconds": hold_seconds, "stock_shards": shards},
    )  # fmt: skip
    if created.status != 201:
        raise RuntimeError(f"the item was not created: {created.status} {created.body}")
    item_id = int(created.body["item_id"])
    warmed = await client.warm(item_id)
    if warmed.status != 200:
        raise RuntimeError(f"the item was not warmed: {warmed.status} {warmed.body}")
    return item_id


async def wait_healthy(clients: list[ApiClient]) -> None:
    give_up = time.monotonic() + START_LIMIT_S
    for client in clients:
        while (await client.health()).status != 200:
            if time.monotonic() > give_up:
                raise RuntimeError(f"{client.base_url} not healthy in {START_LIMIT_S:.0f} s")
            await asyncio.sleep(0.2)


async def wait_following(settings: Settings) -> None:
    """Until the persister's and the bridge's groups are registered, as an operator starts every
    sink before the sale: a group registered after the persister trimmed the first entries
    would never see them (docs/architecture.md)."""
    wanted = {GROUP, bridge_group("nats")}
    give_up = time.monotonic() + START_LIMIT_S
    async with open_runtime(settings) as runtime:
        while missing := wanted - set(await registered_groups(runtime.redis, DEFAULT_PREFIX)):
            if time.monotonic() > give_up:
                raise RuntimeError(f"{sorted(missing)} not following in {START_LIMIT_S:.0f} s")
            await asyncio.sleep(0.2)


def print_faults(console: Console, faults: list[Fault], record: Record, agreed_s: float) -> None:
    """Per kind: how often, the longest the crowd then waited for its next 202 (another fault
    may have overlapped), and the kind's own figures."""
    table = Table(title="Faults")
    for column in ("fault", "times", "next 202 after (worst)", "figures"):
        table.add_column(column)
    sold_at = sorted(s.answered_at for s in record.sold.values())
    by_kind: dict[str, list[Fault]] = defaultdict(list)
    for f in faults:
        by_kind[f.kind].append(f)
    for kind, seen in sorted(by_kind.items()):
        totals = Counter[str]()
        worst: dict[str, float] = {}
        for f in seen:
            for name, value in f.figures.items():
                totals[name] += int(value)
                worst[name] = max(worst.get(name, 0.0), value)
        waits = [next((t - f.at for t in sold_at if t >= f.at), float("nan")) for f in seen]
        shown = ", ".join(f"{name} {worst[name]:.1f} at most, {totals[name]} in all"
                          for name in sorted(totals))  # fmt: skip
        table.add_row(kind, str(len(seen)), f"{max(waits):.2f} s", shown)
    console.print(table)
    unavailable = record.unavailable_outcomes()
    console.print(f"503s and no answers, retried: {dict(unavailable.most_common())}")
    # When each kind of refusal came, and to what: where a run that fails lost its time.
    for outcome, _ in unavailable.most_common(3):
        times = Counter(int(at // 10) * 10 for at, said, _, _ in record.unavailable
                        if said == outcome)  # fmt: skip
        calls = Counter(f"{action} api-{api}" for _, said, action, api in record.unavailable
                        if said == outcome)  # fmt: skip
        shown = ", ".join(f"{start} s: {n}" for start, n in sorted(times.items()))
        console.print(f"{outcome} by 10 s: {shown}; by request: {dict(calls.most_common(4))}")
    console.print(f"final answers: {dict(record.outcomes.most_common())}")
    console.print(f"Redis == SQL {agreed_s:.1f} s after the last request")
    stores = [f"{f.kind} {f.at:.1f} s" for f in faults if f.kind in ("master", "rewind", "sql")]
    console.print(f"Redis and SQL faults at: {', '.join(stores)}")


def print_verdicts(console: Console, found: list[Verdict]) -> bool:
    table = Table(title="Verdicts")
    for column in ("verdict", "", "detail"):
        table.add_column(column)
    for v in found:
        table.add_row(v.name, "[green]PASS[/]" if v.ok else "[red]FAIL[/]", v.detail)
    console.print(table)
    return all(v.ok for v in found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="The test suite's shorter run.")
    parser.add_argument("--seconds", type=float, help="The faults' window.")
    parser.add_argument("--stock", type=int)
    parser.add_argument("--shards", type=int)
    parser.add_argument("--rate", type=float, help="Buyers arriving per second.")
    parser.add_argument("--seed", type=int)
    args = parser.parse_args()
    knobs = Knobs.small() if args.small else Knobs()
    given = {k: v for k, v in vars(args).items() if k != "small" and v is not None}
    knobs = replace(knobs, **given)
    ok = asyncio.run(soak(knobs, Console()))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
