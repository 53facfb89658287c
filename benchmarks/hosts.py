"""A sale rehearsed across hosts: each host a Linux network namespace on this machine.

    python -m benchmarks.hosts [--small] [--buyers N] [--stock N] [--rate R] [--shards N]

The hosts (root only: ``ip netns``), on a private subnet 10.x.y.0/24 behind one Linux bridge that
lives in a namespace of its own (``sk-<run>-lan``), so nothing is added to the machine's own
network namespace: ``redis`` (a Redis Cluster of 3 masters with a replica each), ``db`` (a
PostgreSQL instance of the run's own, at PostgreSQL's default max_connections), ``pgbouncer``
(PgBouncer with the deployment's settings, ``deploy/k8s/base/pgbouncer.ini``: transaction
pooling; every seckill process reaches SQL through it, with the database URL's parameters as
deploy.md writes them), ``api1`` and ``api2`` (one ``seckill api`` each),
``workers`` (persister, reaper, reconciler and archiver, each its own ``seckill worker``) and
``client`` (the crowd and the verdicts). Every seckill process is started from the command line
and the plain environment its role has in the Kubernetes manifests (``deploy/k8s/base``,
rendered with kubectl; ``benchmarks.manifests``), the production profile among them, with the
rehearsal's own stores, keys, addresses, ports and data directories layered on top, as a host
of a real deployment would run it. They start in the order of the documented first deploy
(docs/operations/deploy.md, "The migration, then the rest"; ``benchmarks.deploy_steps``): each
``kubectl apply -l SELECTOR`` starts the roles its selector takes (PgBouncer and the migration,
then the rest), ``kubectl rollout status`` waits for a role to be ready, ``kubectl wait`` for the
migration to complete.

The sale: buyers spread over both APIs (each buyer tries one and, when it gets no answer or a
503, sends the same request, with the same idempotency key or payment id, to the other); they
pay, cancel or let their short hold run out. Mid-sale the ``api1`` host is killed outright
(SIGKILL to every process in its namespace) and the worker host is replaced: its workers are
stopped, its namespace removed, and a fresh ``workers2`` host, with a new address and data
directory, runs them in its place. Once the first crowd has gone, buyers who pay come until the
stock is gone; then ``api2`` gets SIGTERM with ``SECKILL_DRAIN_SECONDS=1`` while its /readyz is
polled.

The verdicts: no oversell, no undersell, no buyer above the limit, every 202 landed in SQL once,
every `paid` answer still paid, Redis == SQL and the audit passes, SQL reached through
PgBouncer within its server pool, every request answered with no server error, the surviving
API served on after the kill, and /readyz of the draining host went 503 before it stopped.
Exit code 0 when every verdict passes, 1 when one fails, 3 when hosts cannot be built here
(not root, no ``ip netns``, no PostgreSQL, PgBouncer, redis-server or kubectl: the message says
which). Every namespace and process of the run is removed at the end, on failure
and on Ctrl-C too; a run's namespaces are named ``sk-<run>-<host>``, and ``--clean RUN``
removes what a run killed outright left behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.table import Table
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import create_async_engine

from benchmarks.deploy_steps import (
    as_documented,
    documented_sequence,
    selected_components,
    workload_component,
)
from benchmarks.manifests import NoKubectl, Role, k8s_roles, render
from benchmarks.pooler import NoPgBouncer, PgBouncer, deployed_settings, pooled_url
from benchmarks.pooler import binary as pgbouncer_binary
from benchmarks.soak import (
    Buyers,
    Process,
    Record,
    Verdict,
    put_on_sale,
    tally,
    wait_healthy,
    wait_settled,
)
from seckill.bootstrap.keys import crowd_credentials
from seckill.bootstrap.runtime import open_runtime
from seckill.config import Settings
from seckill.crowd.client import ApiClient, Credentials, Reply
from seckill.domain.orders import OrderStatus
from seckill.redis_cluster import LocalCluster
from seckill.services.reconcile.records import audit_records
from seckill.store.tables import Order

EXIT_NO_HOSTS = 3  # hosts cannot be built here: the message says why
RUN_NAMESPACE = re.compile(r"sk-([0-9a-f]{6})-[a-z0-9]+")  # sk-<run>-<host>
NETNS_DIR = Path("/var/run/netns")
API_PORT = 8000
SQL_PORT = 5432
POSTGRES_MAX_CONNECTIONS = 100  # PostgreSQL's default, which capacity.md's budget is sized for
DATABASE = "seckill"
DRAIN_SECONDS = 1
# The last octet of each host's address; workers2 is the worker host's replacement.
HOSTS = {
    "redis": 10,
    "db": 20,
    "pgbouncer": 25,
    "api1": 31,
    "api2": 32,
    "workers": 41,
    "client": 50,
}
REPLACEMENT = ("workers2", 42)
# The worker host's roles, each started from its manifest (deploy/k8s/base), each on a metrics
# port of its own (one host runs them all). The rehearsal's own flags follow the manifest's
# argv: a persister on the replaced host takes over what the old one left within 2 s.
WORKERS = {"persister": 9101, "reaper": 9102, "reconciler": 9103, "archiver": 9104}
REHEARSAL_FLAGS = {"persister": ("--claim-idle-ms", "2000")}
READY_POLL_S = 0.05
STOP_LIMIT_S = 20.0


@dataclass(frozen=True, slots=True)
class Knobs:
    buyers: int = 2_400  # the first crowd; buyers who pay come after it until the stock is gone
    stock: int = 900
    rate: float = 40.0  # buyers arriving per second
    shards: int = 2
    hold_seconds: int = 3
    server: str = "uvicorn"  # seckill api's default
    seed: int = 7

    @classmethod
    def small(cls) -> Knobs:
        """The test suite's run: every host and fault, a small crowd, well under a minute."""
        return cls(buyers=200, stock=80, rate=20.0)


# -- the hosts: network namespaces on one bridge ---------------------------------------------


class NoHosts(RuntimeError):
    """Hosts cannot be built on this machine (the message says why)."""


def ip(*args: str) -> str:
    """``ip ARGS``; its output. Raises NoHosts with ip's own words when it fails."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise NoHosts(f"ip {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


@dataclass(frozen=True, slots=True)
class Network:
    """One run's namespaces: ``sk-<run>-lan`` holds the bridge, each host a veth into it."""

    run: str
    subnet: str  # the first three octets, e.g. "10.213.7"

    def ns(self, host: str) -> str:
        return f"sk-{self.run}-{host}"

    def address(self, host: str) -> str:
        octet = HOSTS.get(host) or dict([REPLACEMENT])[host]
        return f"{self.subnet}.{octet}"

    def exec(self, host: str) -> tuple[str, ...]:
        """The command prefix that runs a program on ``host``."""
        return ("ip", "netns", "exec", self.ns(host))

    def build(self) -> None:
        lan = self.ns("lan")
        ip("netns", "add", lan)
        ip("-n", lan, "link", "add", "br0", "type", "bridge")
        ip("-n", lan, "link", "set", "br0", "up")
        for host in HOSTS:
            self.add_host(host)

    def add_host(self, host: str) -> None:
        """A namespace with ``lo`` up and ``eth0`` on the bridge at the host's address (its
        veth's other end, in the bridge's namespace, is named after the host)."""
        ns, lan = self.ns(host), self.ns("lan")
        ip("netns", "add", ns)
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", host, "netns", lan)
        ip("-n", lan, "link", "set", host, "master", "br0", "up")
        ip("-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
        ip("-n", ns, "link", "set", "eth0", "up")

    def namespaces(self) -> list[str]:
        """The run's namespaces that exist now."""
        return sorted(n for n in listed_namespaces() if n.startswith(f"sk-{self.run}-"))

    def remove_host(self, host: str) -> None:
        remove_namespace(self.ns(host))

    def remove(self) -> None:
        """Every process in the run's namespaces ended, then the namespaces (their veths and
        the bridge go with them)."""
        names = self.namespaces()
        for name in names:
            signal_all(name, signal.SIGTERM)
        give_up = time.monotonic() + 5
        while time.monotonic() < give_up and any(pids_in(name) for name in names):
            time.sleep(0.1)
        for name in names:
            remove_namespace(name)


def listed_namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def pids_in(ns: str) -> list[int]:
    """The processes in namespace ``ns`` (each one the run started there)."""
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    return [int(word) for word in out.split() if word.isdigit() and int(word) != os.getpid()]


def signal_all(ns: str, signum: signal.Signals) -> list[int]:
    pids = pids_in(ns)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
    return pids


def remove_namespace(ns: str) -> None:
    signal_all(ns, signal.SIGKILL)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def free_subnet() -> str:
    """10.x.y, in no route of the machine's and no other run's."""
    used = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    for name in listed_namespaces():
        if name.startswith("sk-"):
            used += subprocess.run(
                ["ip", "-n", name, "-4", "-o", "addr"], capture_output=True, text=True
            ).stdout
    rng = random.SystemRandom()
    for _ in range(100):
        subnet = f"10.{rng.randrange(64, 250)}.{rng.randrange(1, 250)}"
        if f"{subnet}." not in used:
            return subnet
    raise NoHosts("no free 10.x.y.0/24 subnet")


def manifest_roles(documents: list[dict[str, Any]] | None = None) -> dict[str, Role]:
    """Each role as deploy/k8s/base declares it (rendered with kubectl)."""
    roles = k8s_roles(render() if documents is None else documents)
    missing = {"api", "migration", *WORKERS} - set(roles)
    if missing:
        raise RuntimeError(f"deploy/k8s/base declares no {', '.join(sorted(missing))}")
    return roles


def postgres_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: p.parent)
    return found[-1].parent if found else None


def why_no_hosts() -> str | None:
    """Why hosts cannot be built on this machine, or None."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    for tool in ("ip", "nsenter", "runuser"):
        if shutil.which(tool) is None:
            return f"no {tool} on PATH"
    if shutil.which("redis-server") is None:
        return "no redis-server on PATH"
    if postgres_bin() is None:
        return "no PostgreSQL server (/usr/lib/postgresql/*/bin/postgres)"
    try:
        pgbouncer_binary()
    except NoPgBouncer as exc:
        return str(exc)
    if shutil.which("psql") is None:
        return "no psql on PATH (PgBouncer's statistics are read with it)"
    try:
        manifest_roles()
    except NoKubectl as exc:
        return str(exc)
    return None


# -- the database host -----------------------------------------------------------------------


class Postgres:
    """A PostgreSQL instance of the run's own on the ``db`` host, run as the postgres user,
    trusting the run's subnet (no other network can reach it)."""

    def __init__(self, network: Network, directory: Path, log: Path) -> None:
        self.network = network
        self.directory = directory
        self.data = directory / "data"
        self.log = log
        self.popen: subprocess.Popen[bytes] | None = None
        self.bin = postgres_bin() or Path("/nonexistent")

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@{self.network.address('db')}:{SQL_PORT}"

    def as_postgres(self, program: str, *args: str) -> list[str]:
        return [*self.network.exec("db"), "runuser", "-u", "postgres", "--",
                str(self.bin / program), *args]  # fmt: skip

    def start(self) -> None:
        self.directory.mkdir(parents=True)
        shutil.chown(self.directory, "postgres", "postgres")
        initdb = self.as_postgres(
            "initdb", "--no-sync", "-D", str(self.data), "-U", "postgres", "--auth=trust"
        )
        done = subprocess.run(initdb, capture_output=True, text=True, cwd=self.directory)
        if done.returncode:
            raise RuntimeError(f"initdb failed: {done.stdout}{done.stderr}")
        with (self.data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {self.network.subnet}.0/24 trust\n")
        settings = {
            "listen_addresses": self.network.address("db"),
            "port": str(SQL_PORT),
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": str(POSTGRES_MAX_CONNECTIONS),
            "unix_socket_directories": str(self.directory),
        }
        argv = self.as_postgres(
            "postgres", "-D", str(self.data), *(f"-c{k}={v}" for k, v in settings.items())
        )
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, cwd=self.directory
            )

    async def wait_ready(self) -> None:
        engine = create_async_engine(self.url + "/postgres", isolation_level="AUTOCOMMIT")
        give_up = time.monotonic() + 60
        try:
            while True:
                try:
                    async with engine.connect() as conn:
                        await conn.execute(text(f'CREATE DATABASE "{DATABASE}"'))
                    return
                except Exception as exc:  # not up yet: refused, or starting
                    if self.popen is not None and self.popen.poll() is not None:
                        raise RuntimeError(f"postgres exited: see {self.log}") from exc
                    if time.monotonic() > give_up:
                        raise
                    await asyncio.sleep(0.2)
        finally:
            await engine.dispose()

    def stop(self) -> None:
        """A fast shutdown (SIGINT to the postmaster): its shared memory goes with it."""
        if self.popen is None or self.popen.poll() is not None:
            return
        pid_file = self.data / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError, ProcessLookupError):
            os.kill(int(pid_file.read_text().split()[0]), signal.SIGINT)
        try:
            self.popen.wait(timeout=STOP_LIMIT_S)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


# -- the deployment, as the client host sees it ----------------------------------------------


@dataclass(frozen=True, slots=True)
class Plan:
    """What the parent built and hands to the conductor on the client host."""

    run: str
    subnet: str
    scratch: str
    logs: str
    knobs: dict[str, Any]

    @property
    def network(self) -> Network:
        return Network(self.run, self.subnet)


class Site:
    """Every host's processes, started in order and stopped in reverse."""

    def __init__(self, plan: Plan, knobs: Knobs) -> None:
        self.network = network = plan.network
        self.scratch = Path(plan.scratch)
        self.logs = Path(plan.logs)
        self.knobs = knobs
        self.secrets = {
            name: secrets.token_hex(32)
            for name in ("SECKILL_JWT_SECRET", "SECKILL_TICKET_SECRET", "SECKILL_PAYMENT_SECRET")
        }
        self.cluster = LocalCluster(
            masters=3, replicas=1, host=network.address("redis"), launcher=network.exec("redis"),
            binary=shutil.which("redis-server"),
        )  # fmt: skip
        self.db = Postgres(network, self.scratch / "db", self.logs / "postgres.log")
        self.pgbouncer = PgBouncer(
            self.scratch / "pgbouncer", host=network.address("pgbouncer"),
            port=int(deployed_settings()["listen_port"]), server_host=network.address("db"),
            server_port=SQL_PORT, server_user="postgres", launcher=network.exec("pgbouncer"),
        )  # fmt: skip
        self.documents = render()
        self.roles = manifest_roles(self.documents)
        self.migration: Process | None = None
        self.apis = [self.process(host, "api", "--server", knobs.server)
                     for host in ("api1", "api2")]  # fmt: skip
        self.workers = self.worker_processes("workers")
        self.retired: list[Process] = []

    def process(self, host: str, role: str, *flags: str, name: str | None = None) -> Process:
        """``role``'s process on ``host``: the manifest's argv, then the rehearsal's ``flags``;
        the manifest's plain environment under the host's own (``env``)."""
        declared = self.roles[role]
        argv = [*self.network.exec(host), sys.executable, "-m", "seckill.cli", *declared.argv,
                *flags]  # fmt: skip
        log = self.logs / f"{name or host}.log"
        return Process(name or host, argv, lambda: self.env(host, declared), log)

    def worker_processes(self, host: str) -> list[Process]:
        return [self.process(host, kind, *REHEARSAL_FLAGS.get(kind, ()), name=f"{host}-{kind}")
                for kind in WORKERS]  # fmt: skip

    @property
    def processes(self) -> list[Process]:
        return [*self.apis, *self.workers, *self.retired]

    def env(self, host: str, role: Role | None = None) -> dict[str, str]:
        """A host's environment: the role's plain settings as the manifests declare them
        (no secret file paths), under the rehearsal's own stores, keys, addresses, ports and
        data directory; the hosts learn the cluster from different masters."""
        ours = {k: v for k, v in os.environ.items() if not k.startswith("SECKILL_")}
        declared = role.plain_env() if role is not None else {}
        primaries = self.cluster.ports[: self.cluster.masters]
        node = primaries[[*HOSTS, REPLACEMENT[0]].index(host) % len(primaries)]
        metrics = {}
        if role is not None and role.name in WORKERS:
            metrics = {"SECKILL_METRICS_HOST": self.network.address(host),
                       "SECKILL_METRICS_PORT": str(WORKERS[role.name])}  # fmt: skip
        return ours | declared | self.secrets | metrics | {
            "SECKILL_PROFILE": "production",
            "SECKILL_REDIS_URL": f"redis://{self.network.address('redis')}:{node}",
            "SECKILL_REDIS_CLUSTER": "true",
            "SECKILL_DATABASE_URL": self.database_url,
            "SECKILL_DATA_DIR": str(self.scratch / host),
            "SECKILL_API_HOST": self.network.address(host),
            "SECKILL_API_PORT": str(API_PORT),
            "SECKILL_DRAIN_SECONDS": str(DRAIN_SECONDS),
            "SECKILL_TICKET_TTL_SECONDS": "600",
            "SECKILL_RATE_LIMIT_REQUESTS": "1000",
            "SECKILL_REAPER_INTERVAL_SECONDS": "0.2",
            "SECKILL_RECONCILE_INTERVAL_SECONDS": "2",
            "SECKILL_LOG_LEVEL": "WARNING",
        }  # fmt: skip

    @property
    def database_url(self) -> str:
        """The database through PgBouncer, with the parameters deploy.md's URL has."""
        through = pooled_url(
            f"{self.db.url}/{DATABASE}", host=self.pgbouncer.host, port=self.pgbouncer.port
        )
        return as_documented(through)

    def settings(self) -> Settings:
        """The client host's settings: the same stores and keys."""
        ours = {k: v for k, v in self.env("client").items() if k.startswith("SECKILL_")}
        return Settings.model_validate(
            {k.removeprefix("SECKILL_").lower(): v for k, v in ours.items()}
        )

    def api_url(self, host: str) -> str:
        return f"http://{self.network.address(host)}:{API_PORT}"

    async def start(self, console: Console) -> None:
        """The stores, then deploy.md's first deploy, command by command."""
        await asyncio.gather(
            asyncio.to_thread(self.cluster.start), asyncio.to_thread(self.db.start)
        )
        await self.db.wait_ready()
        console.print("the documented deploy (docs/operations/deploy.md, step 3):")
        for command in documented_sequence():
            if command.verb == "apply":
                components = selected_components(self.documents, command.selector)
                done = [await self.apply(component) for component in components]
            elif command.verb == "rollout":
                done = [await self.rolled_out(workload_component(self.documents, command.target))]
            elif command.verb == "wait":
                done = [await self.completed(workload_component(self.documents, command.target))]
            else:
                done = ["nothing to do on a new site"]
            console.print(f"  $ {command.line.strip()}\n      {'; '.join(done)}")

    async def apply(self, component: str) -> str:
        """Start what ``component`` declares on its hosts; what was done."""
        if component == "pooler":
            if self.pgbouncer.popen is not None:
                return "pooler: unchanged"
            await asyncio.to_thread(self.pgbouncer.start)
            return f"pooler: PgBouncer on {self.pgbouncer.host}:{self.pgbouncer.port}"
        if component == "migration":
            migration = self.roles["migration"]
            argv = [*self.network.exec("workers"), sys.executable, "-m", "seckill.cli",
                    *migration.argv]  # fmt: skip
            self.migration = Process("migration", argv, lambda: self.env("workers", migration),
                                     self.logs / "migration.log")  # fmt: skip
            self.migration.start()
            return "migration: seckill db upgrade started on workers"
        if component == "api":
            for p in self.apis:
                p.start()
            return "api: api1, api2"
        if component in WORKERS:
            for p in self.workers:
                if p.name.endswith(f"-{component}"):
                    p.start()
            return f"{component}: on workers"
        return f"{component}: not run on these hosts"

    async def rolled_out(self, component: str) -> str:
        """Wait for ``component``'s processes to answer as ready."""
        if component == "pooler":
            await asyncio.to_thread(self.pgbouncer.admin, "SHOW VERSION")
            return "PgBouncer answers"
        if component == "api":
            give_up = time.monotonic() + 60
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
                for host in ("api1", "api2"):
                    while True:
                        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                            async with session.get(self.api_url(host) + "/readyz") as answer:
                                if answer.status == 200:
                                    break
                        if time.monotonic() > give_up:
                            raise RuntimeError(f"{host}: /readyz not 200 within 60 s")
                        await asyncio.sleep(0.1)
            return "api1 and api2 ready (/readyz 200)"
        return f"{component}: nothing to wait for"

    async def completed(self, component: str) -> str:
        """Wait for the migration to exit; it must succeed."""
        if component != "migration" or self.migration is None:
            raise RuntimeError(f"deploy.md waits for {component}, which was never applied")
        popen = self.migration.popen
        assert popen is not None
        code = await asyncio.to_thread(popen.wait, 300)
        if code:
            raise RuntimeError(
                f"seckill db upgrade exited {code}: {self.migration.log.read_text()[-3000:]}"
            )
        return "migration complete (exit 0)"

    def kill_host(self, host: str) -> int:
        """SIGKILL to every process on ``host``; how many there were."""
        killed = signal_all(self.network.ns(host), signal.SIGKILL)
        for p in self.processes:
            if p.argv[: len(self.network.exec(host))] == list(self.network.exec(host)):
                p.held_down = True
                if p.popen is not None:
                    p.popen.wait()
        return len(killed)

    async def replace_workers(self) -> None:
        """The worker host's processes stopped (SIGTERM: each finishes what it holds), its
        namespace removed, and a fresh host with a new address and data directory in its
        place."""
        await asyncio.gather(*(asyncio.to_thread(p.stop) for p in self.workers))
        self.retired += self.workers
        host = REPLACEMENT[0]
        await asyncio.to_thread(self.network.remove_host, "workers")
        await asyncio.to_thread(self.network.add_host, host)
        self.workers = self.worker_processes(host)
        for p in self.workers:
            p.start()

    def stop(self) -> None:
        for p in self.processes:
            p.stop()
        self.pgbouncer.stop()
        self.cluster.stop()
        self.db.stop()


# -- the sale ---------------------------------------------------------------------------------


class HostClient(ApiClient):
    """An API host's client that keeps when each answer came (status 0: none)."""

    def __init__(
        self, session: aiohttp.ClientSession, base_url: str, credentials: Credentials
    ) -> None:
        super().__init__(session, base_url, credentials)
        self.answers: list[tuple[float, int]] = []

    async def request(self, method: str, path: str, **options: Any) -> Reply:
        reply = await super().request(method, path, **options)
        self.answers.append((time.monotonic(), reply.status))
        return reply

    def since(self, moment: float) -> Counter[int]:
        return Counter(status for at, status in self.answers if at >= moment)


class HostBuyers(Buyers):
    """Buyers who also take a 503 to the other API: a host that is draining or down."""

    other_api_after = frozenset({0, 503})


@dataclass(slots=True)
class Faults:
    killed_at: float = 0.0  # monotonic
    killed_processes: int = 0
    replaced_at: float = 0.0
    replaced_s: float = 0.0
    notes: list[str] = field(default_factory=list)


async def faults(site: Site, knobs: Knobs, record: Record, done: Faults, console: Console) -> None:
    """api1's host killed a third of the way through the first crowd, the worker host replaced
    half way."""
    crowd_s = knobs.buyers / knobs.rate
    await asyncio.sleep(crowd_s / 3)
    done.killed_processes = await asyncio.to_thread(site.kill_host, "api1")
    done.killed_at = time.monotonic()  # from here on nothing on api1 can answer
    console.print(
        f"  {record.now():5.1f} s  api1's host killed: SIGKILL to its "
        f"{done.killed_processes} processes"
    )
    await asyncio.sleep(max(0.0, crowd_s / 2 - record.now()))
    done.replaced_at = time.monotonic()
    await site.replace_workers()
    done.replaced_s = time.monotonic() - done.replaced_at
    console.print(
        f"  {record.now():5.1f} s  worker host replaced: workers stopped and removed, "
        f"{REPLACEMENT[0]} at {site.network.address(REPLACEMENT[0])} started "
        f"({done.replaced_s:.1f} s)"
    )


@dataclass(slots=True)
class Drain:
    """What api2's /readyz answered around its SIGTERM."""

    before: int = 0  # /readyz's status before the SIGTERM
    polls: list[tuple[float, int, bool]] = field(
        default_factory=list
    )  # (s after, status, draining)
    exit_code: int | None = None
    stopped_after_s: float | None = None


async def drain(site: Site, client: HostClient, console: Console) -> Drain:
    """SIGTERM to api2, /readyz polled from before it until the host answers no more."""
    found = Drain()
    found.before = (await client.request("GET", "/readyz")).status
    if found.before == 404:
        return found
    api = site.apis[1]
    assert api.popen is not None
    sent = time.monotonic()
    api.popen.send_signal(signal.SIGTERM)
    while time.monotonic() - sent < STOP_LIMIT_S:
        reply = await client.request("GET", "/readyz")
        found.polls.append(
            (time.monotonic() - sent, reply.status, bool(reply.body.get("draining")))
        )
        if reply.status == 0 and api.popen.poll() is not None:
            break
        await asyncio.sleep(READY_POLL_S)
    with contextlib.suppress(subprocess.TimeoutExpired):
        found.exit_code = await asyncio.to_thread(api.popen.wait, STOP_LIMIT_S)
        found.stopped_after_s = time.monotonic() - sent
    console.print(f"  api2 sent SIGTERM: {drain_story(found)}")
    return found


def drain_story(found: Drain) -> str:
    if found.before == 404:
        return "skipped: no /readyz"
    draining = [at for at, status, flag in found.polls if status == 503 and flag]
    refused = next((at for at, status, _ in found.polls if status == 0), None)
    parts = [f"/readyz {found.before} before"]
    if draining:
        parts.append(
            f"503 draining from {draining[0]:.2f} s to {draining[-1]:.2f} s after "
            f"({len(draining)} polls)"
        )
    else:
        parts.append("never 503 draining")
    parts.append("no answer from " + (f"{refused:.2f} s" if refused is not None else "(never)"))
    if found.stopped_after_s is not None:
        parts.append(f"exited {found.exit_code} at {found.stopped_after_s:.2f} s")
    return ", ".join(parts)


async def conduct(plan: Plan, console: Console) -> bool:
    knobs = Knobs(**plan.knobs)
    site = Site(plan, knobs)
    network = site.network
    console.print(
        f"hosts on {network.subnet}.0/24 (bridge in {network.ns('lan')}): "
        + ", ".join(f"{host} .{octet}" for host, octet in HOSTS.items())
    )
    try:
        started = time.monotonic()
        await site.start(console)
        console.print(
            f"started in {time.monotonic() - started:.1f} s: Redis Cluster "
            f"{network.address('redis')}:{site.cluster.ports} (3 masters, a replica each), "
            f"PostgreSQL {network.address('db')}:{SQL_PORT} behind PgBouncer "
            f"{site.pgbouncer.host}:{site.pgbouncer.port}, {knobs.server} on api1 and api2, "
            f"{', '.join(WORKERS)} on workers"
        )
        return await sale(site, knobs, console)
    finally:
        await asyncio.to_thread(site.stop)


async def sale(site: Site, knobs: Knobs, console: Console) -> bool:
    settings = site.settings()
    credentials = crowd_credentials(settings)
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        clients = [HostClient(session, site.api_url(host), credentials)
                   for host in ("api1", "api2")]  # fmt: skip
        await wait_healthy(list(clients))
        item_id = await put_on_sale(
            clients[0], "hosts", stock=knobs.stock, shards=knobs.shards,
            hold_seconds=knobs.hold_seconds,
        )  # fmt: skip
        rng = random.Random(knobs.seed)
        record = Record()
        buyers = HostBuyers(list(clients), item_id, record, rng)
        console.print(
            f"sale: item {item_id}, {knobs.stock} units over {knobs.shards} shards, "
            f"{knobs.buyers} buyers at {knobs.rate:.0f}/s over both APIs, "
            f"holds of {knobs.hold_seconds} s"
        )
        done = Faults()
        pool = PoolWatch(site.pgbouncer)
        watching = asyncio.create_task(pool.watch())
        await asyncio.gather(
            faults(site, knobs, record, done, console),
            buyers.arrive(knobs.rate, lambda: record.buyers >= knobs.buyers, "buyer-"),
        )
        console.print(f"  {record.now():5.1f} s  first crowd done; buyers who pay until sold out")
        agreed_s = await wait_settled(list(clients), buyers, item_id, settings, console)
        console.print(
            f"  {record.now():5.1f} s  sold out; Redis == SQL {agreed_s:.1f} s after the "
            "last request"
        )
        audited = await clients[1].audit(item_id)
        server_checks = audited.body.get("checks") if audited.status == 200 else None
        drained = await drain(site, clients[1], console)
    found = await verdicts(settings, item_id, knobs, record, clients, done, drained, server_checks)
    watching.cancel()
    found.append(await pool.verdict())
    console.print(f"final answers: {dict(record.outcomes.most_common())}")
    unavailable = record.unavailable_outcomes()
    console.print(f"503s and no answers, retried on the other API: {dict(unavailable)}")
    return print_verdicts(console, found)


# -- the verdicts ----------------------------------------------------------------------------


class PoolWatch:
    """PgBouncer's pool for the sale's database, sampled through the sale: the most server
    and client connections seen at once."""

    SERVER = ("sv_active", "sv_idle", "sv_used", "sv_tested", "sv_login")
    CLIENT = ("cl_active", "cl_waiting")

    def __init__(self, pgbouncer: PgBouncer) -> None:
        self.pgbouncer = pgbouncer
        self.servers = self.clients = 0

    async def sample(self) -> None:
        pools = await asyncio.to_thread(self.pgbouncer.admin, "SHOW POOLS")
        mine = [row for row in pools if row["database"] == DATABASE]
        self.servers = max(self.servers, sum(int(r[k]) for r in mine for k in self.SERVER))
        self.clients = max(self.clients, sum(int(r[k]) for r in mine for k in self.CLIENT))

    async def watch(self) -> None:
        while True:
            with contextlib.suppress(subprocess.CalledProcessError):
                await self.sample()
            await asyncio.sleep(0.5)

    async def verdict(self) -> Verdict:
        await self.sample()
        stats = await asyncio.to_thread(self.pgbouncer.admin, "SHOW STATS")
        carried = sum(int(r["total_xact_count"]) for r in stats if r["database"] == DATABASE)
        limit = int(self.pgbouncer.settings()["max_db_connections"])
        return Verdict(
            "SQL through PgBouncer", carried > 0 and 0 < self.servers <= limit,
            f"{carried} transactions carried; at most {self.servers} server connections "
            f"(max_db_connections {limit}; PostgreSQL max_connections "
            f"{POSTGRES_MAX_CONNECTIONS}) for up to {self.clients} client connections",
        )  # fmt: skip


async def verdicts(
    settings: Settings, item_id: int, knobs: Knobs, record: Record, clients: list[HostClient],
    done: Faults, drained: Drain, server_checks: list[dict[str, Any]] | None,
) -> list[Verdict | None]:  # fmt: skip
    async with open_runtime(settings) as runtime:
        engine, ledger = runtime.engine, runtime.ledger
        checks = await audit_records(engine, ledger, item_id)
        stock = await engine.stock(item_id)
        async with ledger.engine.connect() as conn:
            rows = (await conn.execute(
                select(Order.id, Order.buyer, Order.quantity, Order.status)
                .where(Order.item_id == item_id)
            )).all()  # fmt: skip
    orders, sold_units, held_units, per_buyer, over = tally(rows)
    lost = [s for s in record.sold.values() if s.order_id not in orders]
    told_paid = [s for s in record.sold.values() if s.paid_at is not None]
    unpaid = [
        s.order_id for s in told_paid
        if s.order_id not in orders or orders[s.order_id].status != OrderStatus.PAID
    ]  # fmt: skip
    failed = [f"{c.name}: {c.detail}" for c in checks if not c.ok]
    if server_checks is None:
        failed.append("the server's audit did not answer")
    else:
        failed += [f"server {c['name']}: {c.get('detail', '')}"
                   for c in server_checks if not c["ok"]]  # fmt: skip
    redis_side = f"Redis {stock.available}/{stock.held}/{stock.sold}" if stock else "Redis gone"
    api1, api2 = (c.since(done.killed_at) for c in clients)
    api2_answers = sum(n for status, n in api2.items() if status)
    api1_answers = sum(n for status, n in api1.items() if status)
    served_202 = sum(
        1 for s in record.sold.values()
        if s.answered_at >= done.killed_at - record.started
    )  # fmt: skip
    return [
        Verdict("no oversell", sold_units + held_units <= knobs.stock,
                f"SQL sold {sold_units} + held {held_units} of {knobs.stock}; {redis_side} "
                "(available/held/sold)"),
        Verdict("no undersell",
                sold_units == knobs.stock and stock is not None and stock.available == 0,
                f"sold {sold_units} of {knobs.stock}, demand {record.buyers} buyers"),
        Verdict("no buyer above the limit", not over,
                f"{len(per_buyer)} buyers hold or paid; {len(over)} above 1 "
                f"({record.second_tries} tried a second purchase)"),
        Verdict("every 202 landed in SQL once", not lost,
                f"{len(record.sold)} answered 202 (over both hosts); {len(orders)} orders in "
                f"SQL; {len(lost)} missing"),
        Verdict("every paid answer still paid", not unpaid,
                f"{len(told_paid)} answered paid; {len(unpaid)} not paid in SQL"
                + "".join(f"; order {o} is {orders[o].status if o in orders else 'gone'}"
                          for o in unpaid[:3])),
        Verdict("Redis == SQL, the audit passes", not failed,
                "; ".join(failed[:4])
                or f"{len(checks)} checks pass, and the server's {len(server_checks or [])}"),
        Verdict("every request answered, no server error",
                not record.unanswered and not record.server_errors,
                f"{len(record.unanswered)} gave up; {len(record.server_errors)} answers 5xx "
                "other than 503" + "".join(f"; {e[:150]}" for e in record.server_errors[:2])),
        Verdict("the surviving API served on", api2_answers > 0 and served_202 > 0,
                f"after api1's host was killed ({done.killed_processes} processes): api2 "
                f"answered {api2_answers} requests, {served_202} purchases 202; api1 answered "
                f"{api1_answers} ({api1[0]} without an answer, each sent again to api2)"),
        readiness_verdict(drained),
    ]  # fmt: skip


def readiness_verdict(drained: Drain) -> Verdict | None:
    """None: the API has no /readyz to judge."""
    if drained.before == 404:
        return None
    answered = [(at, status, flag) for at, status, flag in drained.polls if status]
    went_503 = any(status == 503 and flag for _, status, flag in answered)
    stopped = drained.stopped_after_s is not None
    ok = drained.before == 200 and went_503 and stopped
    return Verdict("/readyz 503 before the host stopped", ok, drain_story(drained))


def print_verdicts(console: Console, found: list[Verdict | None]) -> bool:
    table = Table(title="Verdicts")
    for column in ("verdict", "", "detail"):
        table.add_column(column)
    for v in found:
        if v is None:
            table.add_row("/readyz 503 before the host stopped", "[yellow]SKIP[/]",
                          "skipped: no /readyz")  # fmt: skip
        else:
            table.add_row(v.name, "[green]PASS[/]" if v.ok else "[red]FAIL[/]", v.detail)
    console.print(table)
    return all(v.ok for v in found if v is not None)


# -- the machine's side: build the hosts, run the conductor on the client host, clean up -----


def rehearse(knobs: Knobs, console: Console) -> int:
    why = why_no_hosts()
    if why:
        console.print(f"no hosts: {why}")
        return EXIT_NO_HOSTS
    started = time.monotonic()
    others = sorted({m[1] for n in listed_namespaces() if (m := RUN_NAMESPACE.fullmatch(n))})
    if others:
        console.print(
            f"namespaces of other runs: {', '.join(others)} (running, or left by a run killed "
            "outright: python -m benchmarks.hosts --clean RUN)"
        )
    run = secrets.token_hex(3)
    scratch = Path(tempfile.mkdtemp(prefix=f"seckill-hosts-{run}-"))
    scratch.chmod(0o711)  # the postgres user reaches its own directory inside
    logs = scratch / "logs"
    logs.mkdir()
    code = 1
    network: Network | None = None
    try:
        try:
            network = Network(run, free_subnet())
            network.build()
        except NoHosts as exc:
            console.print(f"no hosts: {exc}")
            code = EXIT_NO_HOSTS
            return code
        plan = Plan(run, network.subnet, str(scratch), str(logs), asdict(knobs))
        client_ns = NETNS_DIR / network.ns("client")
        # nsenter enters the client host's network only: the conductor stays in the machine's
        # mount namespace, where it can add the replacement worker host.
        conductor = subprocess.Popen(
            ["nsenter", f"--net={client_ns}", sys.executable, "-m", "benchmarks.hosts",
             "--conduct", json.dumps(asdict(plan))],
        )  # fmt: skip
        try:
            code = conductor.wait()
        except KeyboardInterrupt:  # the conductor got it too: it stops its processes
            code = 130
            with contextlib.suppress(KeyboardInterrupt, subprocess.TimeoutExpired):
                conductor.wait(timeout=STOP_LIMIT_S)
            conductor.kill()
            conductor.wait()
        return code
    finally:
        if network is not None:
            network.remove()
        if code not in (0, EXIT_NO_HOSTS) and any(logs.iterdir()):
            kept = Path(tempfile.gettempdir()) / f"seckill-hosts-logs-{run}"
            shutil.move(logs, kept)
            console.print(f"the hosts' logs are kept in {kept}")
        shutil.rmtree(scratch, ignore_errors=True)
        left = [n for n in listed_namespaces() if n.startswith(f"sk-{run}-")]
        console.print(
            f"run {run}: {len(left)} namespaces left{': ' + ', '.join(left) if left else ''}; "
            f"wall time {time.monotonic() - started:.0f} s"
        )


def clean(run: str, console: Console) -> int:
    """Remove what run ``run`` left (its namespaces and every process in them)."""
    if not RUN_NAMESPACE.fullmatch(f"sk-{run}-lan"):
        console.print(f"not a run id: {run!r}")
        return 2
    network = Network(run, "")
    names = network.namespaces()
    network.remove()
    console.print(f"removed {len(names)} namespaces of run {run}: {', '.join(names) or 'none'}")
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="The test suite's shorter run.")
    parser.add_argument("--buyers", type=int, help="The first crowd.")
    parser.add_argument("--stock", type=int)
    parser.add_argument("--rate", type=float, help="Buyers arriving per second.")
    parser.add_argument("--shards", type=int)
    parser.add_argument("--hold-seconds", type=int)
    parser.add_argument("--server", choices=("granian", "uvicorn"))
    parser.add_argument("--seed", type=int)
    parser.add_argument("--clean", metavar="RUN", help="Remove what run RUN left behind.")
    parser.add_argument("--conduct", help=argparse.SUPPRESS)  # the client host's side
    args = parser.parse_args()
    console = Console()
    if args.conduct:
        plan = Plan(**json.loads(args.conduct))
        try:
            sys.exit(0 if asyncio.run(conduct(plan, console)) else 1)
        except KeyboardInterrupt:  # every process of the hosts stopped on the way out
            console.print("interrupted")
            sys.exit(130)
    if args.clean:
        sys.exit(clean(args.clean, console))
    knobs = Knobs.small() if args.small else Knobs()
    given = {k: v for k, v in vars(args).items()
             if k not in ("small", "clean", "conduct") and v is not None}  # fmt: skip
    sys.exit(rehearse(replace(knobs, **given), console))


if __name__ == "__main__":
    main()
