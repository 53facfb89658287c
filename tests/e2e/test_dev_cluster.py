"""`seckill dev-cluster`: a real Redis Cluster on loopback from one command, its URL printed,
gone on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys

import pytest
from redis.cluster import RedisCluster

from tests.conftest import redis7_binary


@pytest.mark.parametrize("binary", ["bundled", "redis7"])
def test_dev_cluster_serves_until_sigterm(binary: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SECKILL_")}
    if binary == "redis7":
        env["SECKILL_REDIS_SERVER_BIN"] = redis7_binary()
    command = [sys.executable, "-m", "seckill.cli", "dev-cluster", "--masters", "2"]
    process = subprocess.Popen(
        [*command, "--replicas", "1"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert re.match(r"Redis Cluster up: 2 primaries \(ports \d+, \d+\), 1 replica", first)
        settings = process.stdout.readline()
        found = re.search(r"SECKILL_REDIS_URL=(redis://127\.0\.0\.1:\d+)", settings)
        assert found and "SECKILL_REDIS_CLUSTER=true" in settings, settings
        client = RedisCluster.from_url(found.group(1), decode_responses=True)
        try:
            assert client.cluster_info()["cluster_state"] == "ok"
            # Roles from CLUSTER NODES: Redis 7 leaves a replica out of CLUSTER SLOTS until it
            # has replicated a first byte.
            flags = [node["flags"] for node in client.cluster_nodes().values()]
            assert sum("master" in f for f in flags) == 2 and sum("slave" in f for f in flags) == 2
            for n in range(50):
                client.set(f"seckill:{{item:{n}}}", n)
            assert {client.get_node_from_key(f"seckill:{{item:{n}}}").port for n in range(50)} == {
                node.port for node in client.get_primaries()
            }
            nodes = client.cluster_nodes()
            ports = [int(address.split("@")[0].rsplit(":", 1)[1]) for address in nodes]
            assert len(ports) == 4
        finally:
            client.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        for port in ports:  # every node went with it
            with pytest.raises(ConnectionError):
                socket.create_connection(("127.0.0.1", port), timeout=1)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
