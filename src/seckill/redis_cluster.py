"""A Redis Cluster on loopback that this program owns: started, formed, waited for, stopped.

For trying seckill on a cluster (``seckill dev-cluster``) and for the tests. Every node is a
``RedisServer`` on a free loopback port (its cluster bus on that port + 10000); the cluster is
formed the way ``redis-cli --cluster create`` does it, with no redis-cli needed: each master
takes an even share of the 16,384 slots and a config epoch of its own, the nodes MEET, and each
replica follows its master. Slots that lose their master do not stop the others
(``cluster-require-full-coverage no``): a sale on another master keeps selling through a failover.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

from seckill.redis_server import RedisServer, RedisServerError

SLOTS = 16_384


def free_cluster_port() -> int:
    """A loopback port that is free, and whose cluster bus port (+10000) is free too."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port + 10_000 > 65_535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10_000))
            except OSError:
                continue
        return port
    raise RedisServerError("no free loopback port pair for a cluster node")


def slot_ranges(masters: int) -> list[range]:
    """The 16,384 slots in ``masters`` contiguous, near-equal ranges."""
    bounds = [round(i * SLOTS / masters) for i in range(masters + 1)]
    return [range(start, end) for start, end in pairwise(bounds)]


class LocalCluster:
    """``masters`` primaries with ``replicas`` replicas each, on loopback, until ``stop()``.

    ``node_timeout_ms`` is how long a master may be unreachable before its replica takes over
    (Redis's ``cluster-node-timeout``): short for tests, so a failover takes a few seconds.
    ``host`` and ``launcher`` go to every node (see ``RedisServer``): a cluster on another
    network namespace's address.
    """

    def __init__(
        self,
        *,
        masters: int = 3,
        replicas: int = 1,
        binary: str | Path | None = None,
        host: str = "127.0.0.1",
        launcher: tuple[str, ...] = (),
        node_timeout_ms: int = 2_000,
        appendonly: bool = False,
        start_timeout: float = 30.0,
    ) -> None:
        if masters < 1 or replicas < 0:
            raise ValueError("a cluster needs at least 1 master and 0 or more replicas each")
        self.masters = masters
        self.replicas = replicas
        self._binary = binary
        self.host = host
        self._launcher = launcher
        self._node_timeout_ms = node_timeout_ms
        self._appendonly = appendonly
        self._start_timeout = start_timeout
        self.nodes: list[RedisServer] = []

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes if node.port is not None]

    @property
    def url(self) -> str:
        """A running node's URL: a cluster client learns every other node from it."""
        port = next(node.port for node in self.nodes if node.process is not None)
        return f"redis://{self.host}:{port}"

    def start(self) -> LocalCluster:
        if self.nodes:
            raise RedisServerError("already started")
        try:
            for _ in range(self.masters * (1 + self.replicas)):
                self.nodes.append(self._node(free_cluster_port()).start())
            self._form()
        except BaseException:
            self.stop()
            raise
        return self

    def _node(self, port: int) -> RedisServer:
        return RedisServer(
            binary=self._binary,
            port=port,
            host=self.host,
            launcher=self._launcher,
            appendonly=self._appendonly,
            extra_args=(
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(self._node_timeout_ms),
                "--cluster-require-full-coverage", "no",
                # Redis 7 waits 5 s for more replicas before a diskless full sync: one is enough.
                "--repl-diskless-sync-delay", "0",
            ),
        )  # fmt: skip

    def _form(self) -> None:
        clients = [self.client(port) for port in self.ports]
        try:
            primaries, followers = clients[: self.masters], clients[self.masters :]
            for epoch, (client, slots) in enumerate(
                zip(primaries, slot_ranges(self.masters), strict=True), start=1
            ):
                _command(client, "CLUSTER", "ADDSLOTS", *slots)
                _command(client, "CLUSTER", "SET-CONFIG-EPOCH", epoch)
            for port in self.ports[1:]:
                _command(clients[0], "CLUSTER", "MEET", self.host, port)
            self._wait("every node to know every other", lambda: _all_know(clients))
            ids = [_command(client, "CLUSTER", "MYID") for client in primaries]
            for n, client in enumerate(followers):
                _command(client, "CLUSTER", "REPLICATE", ids[n % self.masters])
            self._wait("the cluster to cover every slot", lambda: _formed(clients, self.replicas))
        finally:
            for client in clients:
                client.close()

    def _wait(self, what: str, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self._start_timeout
        while not done():
            if time.monotonic() > deadline:
                raise RedisServerError(f"timed out waiting for {what}")
            time.sleep(0.05)

    def primary_ports(self) -> list[int]:
        """The ports of the nodes that are primaries now (after a failover, not the same)."""
        found = []
        for node in self.nodes:
            if node.process is None or node.port is None:
                continue
            with self.client(node.port) as client:
                if _command(client, "ROLE")[0] == "master":
                    found.append(node.port)
        return found

    def move_slot(self, slot: int, to_port: int, *, keys_per_call: int = 100) -> int:
        """Move one slot, with its keys, to the primary at ``to_port`` while clients use it: as
        ``redis-cli --cluster reshard`` does. The target imports and the source migrates (a
        client then gets ASK for a key already moved), the keys go over with MIGRATE, and every
        primary learns the new owner (a client then gets MOVED). Returns how many keys moved."""
        with self.client(to_port) as target:
            owner = _slot_owner(target, slot)
            if owner == to_port:
                return 0
            with self.client(owner) as source:
                source_id = _command(source, "CLUSTER", "MYID")
                target_id = _command(target, "CLUSTER", "MYID")
                _command(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
                _command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
                moved = 0
                while keys := _command(source, "CLUSTER", "GETKEYSINSLOT", slot, keys_per_call):
                    _command(source, "MIGRATE", self.host, to_port, "", 0, 5_000, "KEYS", *keys)
                    moved += len(keys)
                # The target first, then the source: a key is never left without an owner.
                for client in (target, source):
                    _command(client, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
        for port in self.primary_ports():
            if port not in (owner, to_port):
                with self.client(port) as other:
                    _command(other, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
        return moved

    def client(self, port: int) -> redis.Redis:
        """A client of the node on ``port`` (replies decoded)."""
        return redis.Redis(host=self.host, port=port, decode_responses=True)

    def node_at(self, port: int) -> RedisServer:
        return next(node for node in self.nodes if node.port == port)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        self.nodes = []

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _all_know(clients: list[redis.Redis]) -> bool:
    expected = len(clients)
    for client in clients:
        lines = str(_command(client, "CLUSTER", "NODES")).strip().splitlines()
        if len(lines) != expected or any("handshake" in line for line in lines):
            return False
    return True


def _formed(clients: list[redis.Redis], replicas: int) -> bool:
    """Every node sees every slot served and every replica in place (so a client that asks any
    node learns the whole layout), and every replica is in sync with its master."""
    masters = len(clients) // (1 + replicas)
    for client in clients:
        info = str(_command(client, "CLUSTER", "INFO"))
        if "cluster_state:ok" not in info or f"cluster_slots_ok:{SLOTS}" not in info:
            return False
        nodes = str(_command(client, "CLUSTER", "NODES")).splitlines()
        if sum("slave" in line.split()[2] for line in nodes) != masters * replicas:
            return False
        role = _command(client, "ROLE")
        if role[0] == "slave" and role[3] != "connected":
            return False
    return True


def _slot_owner(client: redis.Redis, slot: int) -> int:
    """The port of the primary that serves ``slot``, as ``client``'s node sees it."""
    for start, end, primary, *_ in _command(client, "CLUSTER", "SLOTS"):
        if int(start) <= slot <= int(end):
            return int(primary[1])
    raise RedisServerError(f"no primary serves slot {slot}")


def _command(client: redis.Redis, *args: object) -> Any:
    """One command, its reply as Redis sent it (no client-side parsing)."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call]
