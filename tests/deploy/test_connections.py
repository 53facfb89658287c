"""The SQL connection budget at the deployment's largest size, from the rendered manifests:
capacity.md's formula (docs/operations/capacity.md, "Connections") with the API's autoscaler
maximum, every Deployment's replicas (the sale day's included) and the pools seckill.env
sizes, against PgBouncer's client limit, and PgBouncer's server pool against PostgreSQL's
max_connections. The URL deploy.md writes names the PgBouncer Service."""

from __future__ import annotations

import configparser
import copy
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from benchmarks.manifests import runs_seckill
from seckill.config import Settings
from seckill.store.database import through_transaction_pooler
from tests.deploy.test_manifests import DEPLOY_MD, K8S_BASE, TARGETS, rendered

# PostgreSQL's default, which capacity.md sizes for, less the connections it keeps for
# superusers (superuser_reserved_connections) and room for operators and the exporter.
POSTGRES_MAX_CONNECTIONS = 100
SUPERUSER_RESERVED = 3
OPERATORS = 10


@dataclass(frozen=True)
class Budget:
    clients: int  # seckill's connections to PgBouncer, every pool at its bound
    client_limit: int  # PgBouncer's max_client_conn (each pod: a Service may send all to one)
    servers: int  # PgBouncer's connections to PostgreSQL, plus the operators'
    server_limit: int  # PostgreSQL's max_connections less the superusers' reserve
    detail: str

    def problems(self) -> list[str]:
        found = []
        if self.clients > self.client_limit:
            found.append(f"{self.clients} client connections > max_client_conn "
                         f"{self.client_limit} ({self.detail})")  # fmt: skip
        if self.servers > self.server_limit:
            found.append(f"{self.servers} server connections > {self.server_limit} "
                         f"({self.detail})")  # fmt: skip
        return found


def _surge(deployment: dict[str, Any], replicas: int) -> int:
    """The pods a rolling update may add (maxSurge: a number, or a share rounded up)."""
    strategy = deployment["spec"].get("strategy", {})
    if strategy.get("type") == "Recreate":
        return 0
    surge = strategy.get("rollingUpdate", {}).get("maxSurge", "25%")
    if isinstance(surge, str) and surge.endswith("%"):
        return math.ceil(replicas * int(surge[:-1]) / 100)
    return int(surge)


def pgbouncer_settings(documents: list[dict[str, Any]]) -> dict[str, str]:
    (ini,) = [
        d["data"]["pgbouncer.ini"]
        for d in documents
        if d["kind"] == "ConfigMap" and "pgbouncer.ini" in d.get("data", {})
    ]
    parser = configparser.ConfigParser(comment_prefixes=(";", "#"), interpolation=None)
    parser.read_string(ini)
    return dict(parser["pgbouncer"])


def budget(documents: list[dict[str, Any]]) -> Budget:
    """capacity.md's formula on rendered objects:

        clients = 2 * sum of seckill pods * (pool + overflow) + the migration's (pool + overflow)
                  <= max_client_conn
        servers = PgBouncer pods * max_db_connections + 10 <= max_connections - 3

    seckill pods: the autoscaler's maximum where one scales the Deployment, else its replicas
    (twice: old and new pods at once through a rolling deploy's drain); PgBouncer pods: its
    replicas plus what a rollout adds."""
    (config,) = [
        d["data"] for d in documents
        if d["kind"] == "ConfigMap" and "SECKILL_PROFILE" in d.get("data", {})
    ]  # fmt: skip
    fields = Settings.model_fields
    pool = int(config.get("SECKILL_SQL_POOL_SIZE", fields["sql_pool_size"].default))
    overflow = int(config.get("SECKILL_SQL_MAX_OVERFLOW", fields["sql_max_overflow"].default))
    per_process = pool + overflow
    ceilings = {
        d["spec"]["scaleTargetRef"]["name"]: int(d["spec"]["maxReplicas"])
        for d in documents
        if d["kind"] == "HorizontalPodAutoscaler"
    }
    clients, pgbouncer_pods, parts = 0, 0, []
    for doc in documents:
        if doc["kind"] not in ("Deployment", "Job"):
            continue
        (container,) = doc["spec"]["template"]["spec"]["containers"]
        name = doc["metadata"]["name"]
        if doc["kind"] == "Job":
            pods = int(doc["spec"].get("parallelism", 1))
            clients += pods * per_process
            parts.append(f"{name} {pods}")
        elif runs_seckill(container["image"]):
            pods = ceilings.get(name, int(doc["spec"].get("replicas", 1)))
            clients += 2 * pods * per_process
            parts.append(f"{name} 2*{pods}")
        elif "pgbouncer" in container["image"]:
            replicas = int(doc["spec"].get("replicas", 1))
            pgbouncer_pods += replicas + _surge(doc, replicas)
    server_limit = POSTGRES_MAX_CONNECTIONS - SUPERUSER_RESERVED
    detail = f"pools {pool}+{overflow}; " + ", ".join(parts)
    if not pgbouncer_pods:  # every client is a server connection
        return Budget(clients, server_limit, clients + OPERATORS, server_limit, detail)
    bouncer = pgbouncer_settings(documents)
    assert bouncer["pool_mode"] == "transaction", bouncer["pool_mode"]
    per_pod = int(bouncer.get("max_db_connections", 0))
    assert per_pod > 0, "PgBouncer's max_db_connections must bound its server connections"
    return Budget(
        clients=clients,
        client_limit=int(bouncer["max_client_conn"]),
        servers=pgbouncer_pods * per_pod + OPERATORS,
        server_limit=server_limit,
        detail=f"{detail}; {pgbouncer_pods} PgBouncer pods * {per_pod}",
    )


@pytest.mark.parametrize("target", TARGETS, ids=lambda p: p.name)
def test_the_connection_budget_holds_at_the_largest_size(target: Path) -> None:
    found = budget(rendered(target))
    assert found.problems() == []
    assert found.client_limit < 10_000  # PgBouncer's own file descriptors stay modest


def test_seckill_env_sizes_the_pools() -> None:
    env = dict(
        line.split("=", 1)
        for line in (K8S_BASE / "seckill.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert int(env["SECKILL_SQL_POOL_SIZE"]) >= 1
    assert int(env["SECKILL_SQL_MAX_OVERFLOW"]) >= 0


def _scaled(documents: list[dict[str, Any]], kind: str, name: str, **spec: int) -> None:
    doc = next(d for d in documents if d["kind"] == kind and d["metadata"]["name"] == name)
    doc["spec"].update(spec)


def test_a_budget_that_breaks_is_caught() -> None:
    documents = rendered(K8S_BASE)
    assert budget(documents).problems() == []
    # Without PgBouncer, the API's pools at the autoscaler's maximum are PostgreSQL's.
    direct = [d for d in documents if "pgbouncer" not in d["metadata"]["name"]]
    assert budget(direct).problems()
    # A server pool per PgBouncer pod that the pods together cannot have.
    wide = copy.deepcopy(documents)
    config = next(d for d in wide if "pgbouncer.ini" in d.get("data", {}))
    config["data"]["pgbouncer.ini"] = re.sub(
        r"max_db_connections = \d+", "max_db_connections = 60", config["data"]["pgbouncer.ini"]
    )
    assert budget(wide).problems()
    # An autoscaler allowed past what PgBouncer lets in.
    tall = copy.deepcopy(documents)
    _scaled(tall, "HorizontalPodAutoscaler", "seckill-api", maxReplicas=200)
    assert budget(tall).problems()
    # More PgBouncer pods, each with its own server pool.
    more = copy.deepcopy(documents)
    _scaled(more, "Deployment", "seckill-pgbouncer", replicas=5)
    assert budget(more).problems()


def test_deploy_md_points_seckill_at_pgbouncer_through_its_service() -> None:
    """The database-url deploy.md writes names the PgBouncer Service and port, and says it goes
    through a transaction pooler (asyncpg's statement cache off, lock_timeout per transaction)."""
    written = re.search(r"printf %s '([^']+)' > database-url", DEPLOY_MD.read_text())
    assert written, "deploy.md writes no database-url"
    url = make_url(written.group(1))
    documents = rendered(K8S_BASE)
    (service,) = [
        d for d in documents
        if d["kind"] == "Service" and d["metadata"]["labels"].get("app.kubernetes.io/component")
        == "pooler"
    ]  # fmt: skip
    assert url.host == service["metadata"]["name"]
    assert url.port == service["spec"]["ports"][0]["port"]
    assert through_transaction_pooler(written.group(1))
