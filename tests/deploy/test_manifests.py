"""The compose file and the Kubernetes manifests, checked offline against the product.

Rendered with ``kubectl kustomize`` (the base and every overlay), each Kubernetes document is
validated against the API's schema (``kubernetes-validate``; a ServiceMonitor, a CRD, against
what it refers to), and ``deploy/compose.yaml`` against the compose specification's schema
(``check-jsonschema``'s own copy). Then every process they declare is held to what it runs:
each ``SECKILL_*`` is a setting, each command line parses, each probe path is served and each
port is the one the process listens on. Each check is shown to fail on a copy with one mistake.
"""

from __future__ import annotations

import copy
import functools
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from benchmarks.manifests import (
    COMPOSE,
    DEPLOY,
    K8S_BASE,
    OVERLAYS,
    Role,
    compose_roles,
    k8s_roles,
    load_compose,
    render,
)
from seckill.config import ENV_PREFIX, SECRET_SETTINGS, Settings

KUBERNETES_VERSION = "1.30.0"  # the oldest release the manifests promise to apply to
CHECKED_CRDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}
SECKILL = Path(sys.executable).with_name("seckill")
TARGETS = [K8S_BASE, *sorted(p for p in OVERLAYS.iterdir() if p.is_dir())]
WORKER_ROLES = ("persister", "reaper", "reconciler", "archiver", "inlet")


@functools.cache
def rendered(target: Path) -> list[dict[str, Any]]:
    return render(target)


# -- what the product serves, parses and reads -----------------------------------------------


@functools.cache
def serves(app_name: str, path: str) -> bool:
    """Whether GET ``path`` reaches a route of the API (``api``) or of a worker's metrics
    listener (``worker``): asked of the app itself, without starting it (no lifespan, so a
    route that needs the stores fails with 500, which still is a route)."""
    import asyncio

    import httpx

    from seckill.api.app import create_app
    from seckill.api.worker_http import worker_app

    app = create_app(Settings(_env_file=None)) if app_name == "api" else worker_app()  # type: ignore[call-arg]

    async def get() -> int:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://probe") as client:
            return (await client.get(path)).status_code

    return asyncio.run(get()) not in (404, 405)


@functools.cache
def parses(argv: tuple[str, ...]) -> str | None:
    """None when ``seckill ARGV --help`` exits 0, else what it printed."""
    done = subprocess.run(
        [str(SECKILL), *argv, "--help"], capture_output=True, text=True, timeout=60
    )
    return None if done.returncode == 0 else (done.stdout + done.stderr).strip()[-400:]


def option(argv: tuple[str, ...], name: str) -> str | None:
    for i, word in enumerate(argv):
        if word == name and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def listening_port(role: Role) -> int | None:
    """The port the process listens on, as the CLI and the settings decide; None: none."""
    if role.argv[:1] == ("api",) or role.argv[:1] == ("serve",):
        given = option(role.argv, "--port") or role.env.get("SECKILL_API_PORT")
        return int(given) if given else Settings.model_fields["api_port"].default
    if role.argv[:1] == ("worker",):
        given = option(role.argv, "--metrics-port") or role.env.get("SECKILL_METRICS_PORT")
        return int(given) if given else None
    return None


def app_of(role: Role) -> str | None:
    if role.argv[:1] in (("api",), ("serve",)):
        return "api"
    return "worker" if role.argv[:1] == ("worker",) else None


def problems(roles: dict[str, Role]) -> list[str]:
    """Everything a declared process gets wrong, one line each."""
    found = []
    fields = Settings.model_fields
    for role in roles.values():
        where = f"{role.source} ({role.name})"
        for variable in role.env:
            if not variable.startswith(ENV_PREFIX):
                continue
            name = variable.removeprefix(ENV_PREFIX).lower()
            secret_file = name.endswith("_file") and name.removesuffix("_file") in SECRET_SETTINGS
            if name not in fields and not secret_file:
                found.append(f"{where}: {variable} is not a setting")
        if not role.argv:
            found.append(f"{where}: no command line")
        elif (why := parses(role.argv)) is not None:
            found.append(f"{where}: seckill {' '.join(role.argv)} does not parse: {why}")
        port = listening_port(role)
        for declared in role.ports:
            if declared != port:
                found.append(f"{where}: port {declared} declared, the process listens on {port}")
        for path, probe_port in role.probes:
            app = app_of(role)
            if app is None or not serves(app, path):
                found.append(f"{where}: probe path {path} is not served by the {app} app")
            if probe_port != port:
                found.append(f"{where}: probe on port {probe_port}, the process listens on {port}")
        if port is not None:
            host = "SECKILL_API_HOST" if role.argv[0] != "worker" else "SECKILL_METRICS_HOST"
            if role.env.get(host) != "0.0.0.0" and (role.ports or role.probes):
                found.append(f"{where}: {host} is not 0.0.0.0: probes and scrapes cannot reach it")
    return found


# -- rendering and schemas -------------------------------------------------------------------


def test_kubectl_renders_with_a_current_kustomize() -> None:
    done = subprocess.run(
        ["kubectl", "version", "--client"], capture_output=True, text=True, check=True
    )
    version = re.search(r"Kustomize Version: v(\d+)", done.stdout)
    assert version and int(version.group(1)) >= 5, (
        f"kubectl's kustomize is too old for deploy/k8s (labels, envs): {done.stdout}"
    )


def schema_problems(documents: list[dict[str, Any]]) -> list[str]:
    found = []
    services = [d for d in documents if d["kind"] == "Service"]
    for doc in documents:
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        if (doc["apiVersion"], doc["kind"]) in CHECKED_CRDS:
            found += service_monitor_problems(doc, services)
            continue
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            found.append(f"{name}: {error.message} at {'.'.join(map(str, error.path))}")
        except kubernetes_validate.SchemaNotFoundError:
            found.append(f"{name}: no schema for {doc['apiVersion']} {doc['kind']}")
    return found


def service_monitor_problems(monitor: dict[str, Any], services: list[dict[str, Any]]) -> list[str]:
    """A ServiceMonitor selects at least one Service, and each endpoint names one of its ports."""
    name = f"ServiceMonitor/{monitor['metadata']['name']}"
    wanted = monitor["spec"]["selector"]["matchLabels"]
    chosen = [s for s in services if wanted.items() <= (s["metadata"].get("labels") or {}).items()]
    if not chosen:
        return [f"{name}: selects no Service ({wanted})"]
    found = []
    for endpoint in monitor["spec"]["endpoints"]:
        for service in chosen:
            ports = {p.get("name") for p in service["spec"]["ports"]}
            if endpoint.get("port") not in ports:
                found.append(f"{name}: port {endpoint.get('port')!r} not on {ports}")
        if endpoint.get("path", "/metrics") != "/metrics":
            found.append(f"{name}: scrapes {endpoint['path']}, not /metrics")
    return found


@pytest.mark.parametrize("target", TARGETS, ids=lambda p: p.name)
def test_manifests_render_and_match_the_kubernetes_schemas(target: Path) -> None:
    documents = rendered(target)
    kinds = {d["kind"] for d in documents}
    assert {"Deployment", "Job", "Service", "ConfigMap", "PodDisruptionBudget"} <= kinds
    assert {"HorizontalPodAutoscaler", "ServiceMonitor"} <= kinds
    assert schema_problems(documents) == []


def test_compose_matches_the_compose_specification() -> None:
    checker = Path(sys.executable).with_name("check-jsonschema")
    done = subprocess.run(
        [str(checker), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_prometheus_loads_the_alert_rules() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    rules = [DEPLOY / "prometheus" / f for f in config["rule_files"]]
    assert DEPLOY / "prometheus" / "alerts.yaml" in rules
    promtool = shutil.which("promtool")
    if promtool is not None:  # scripts/system-deps installs it with the alert rules' tests
        done = subprocess.run(
            [promtool, "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")],
            capture_output=True, text=True,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert jobs == {f"seckill-{name}" for name in ("api", *WORKER_ROLES)}


# -- the processes against the product -------------------------------------------------------


def test_every_process_of_every_target_is_declared() -> None:
    for target in TARGETS:
        roles = k8s_roles(rendered(target))
        assert set(roles) == {"api", "migration", *WORKER_ROLES}, target
    assert set(compose_roles(load_compose())) == {"api", "migration", *WORKER_ROLES}


@pytest.mark.parametrize("target", TARGETS, ids=lambda p: p.name)
def test_the_manifests_processes_match_the_product(target: Path) -> None:
    assert problems(k8s_roles(rendered(target))) == []


def test_the_compose_processes_match_the_product() -> None:
    assert problems(compose_roles(load_compose())) == []


def test_the_api_and_each_worker_have_their_probes() -> None:
    roles = k8s_roles(rendered(K8S_BASE))
    assert set(roles["api"].probes) >= {("/livez", 8000), ("/readyz", 8000)}
    for name in WORKER_ROLES:
        assert ("/livez", 9100) in roles[name].probes, name
    compose = compose_roles(load_compose())
    assert compose["api"].probes == (("/readyz", 8000),)
    for name in WORKER_ROLES:
        assert compose[name].probes == (("/livez", 9100),), name


def test_the_grace_period_outlasts_the_drain() -> None:
    documents = rendered(K8S_BASE)
    roles = k8s_roles(documents)
    drain = float(roles["api"].env["SECKILL_DRAIN_SECONDS"])
    api = next(d for d in documents if d["kind"] == "Deployment" and "api" in d["metadata"]["name"])
    longest_request = Settings.model_fields["sql_request_timeout_seconds"].default
    assert (
        api["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > drain + longest_request
    )
    compose = load_compose()
    grace = compose["services"]["api"]["stop_grace_period"]
    assert int(grace.removesuffix("s")) > drain + longest_request


def test_secrets_are_mounted_never_inlined() -> None:
    for target in TARGETS:
        documents = rendered(target)
        assert not [d for d in documents if d["kind"] == "Secret"], target
        for role in k8s_roles(documents).values():
            for name in SECRET_SETTINGS:
                variable = ENV_PREFIX + name.upper()
                assert variable not in role.env, f"{role.source}: {variable} inlined"
    text = COMPOSE.read_text()
    for name in ("JWT_SECRET", "TICKET_SECRET", "PAYMENT_SECRET"):
        assert f"SECKILL_{name}: ${{SECKILL_{name}:?" in text, name
    assert "${POSTGRES_PASSWORD:?" in text


# -- each check fails on a copy with one mistake ---------------------------------------------


def k8s_copy() -> list[dict[str, Any]]:
    return copy.deepcopy(rendered(K8S_BASE))


def workload(documents: list[dict[str, Any]], component: str) -> dict[str, Any]:
    for doc in documents:
        if doc["kind"] in ("Deployment", "Job"):
            labels = doc["spec"]["template"]["metadata"]["labels"]
            if labels["app.kubernetes.io/component"] == component:
                container: dict[str, Any] = doc["spec"]["template"]["spec"]["containers"][0]
                return container
    raise LookupError(component)


def config_map(documents: list[dict[str, Any]]) -> dict[str, str]:
    data: dict[str, str] = next(d for d in documents if d["kind"] == "ConfigMap")["data"]
    return data


def misspelt_setting(docs: list[dict[str, Any]]) -> None:
    data = config_map(docs)
    data["SECKILL_DRAIN_SECOND"] = data.pop("SECKILL_DRAIN_SECONDS")


def file_of_a_plain_setting(docs: list[dict[str, Any]]) -> None:
    workload(docs, "reaper").setdefault("env", []).append(
        {"name": "SECKILL_LOG_LEVEL_FILE", "value": "/run/secrets/seckill/log-level"}
    )


def bad_probe_path(docs: list[dict[str, Any]]) -> None:
    workload(docs, "api")["readinessProbe"]["httpGet"]["path"] = "/ready"


def worker_probe_path_of_the_api(docs: list[dict[str, Any]]) -> None:
    workload(docs, "reconciler")["livenessProbe"]["httpGet"]["path"] = "/readyz"


def wrong_container_port(docs: list[dict[str, Any]]) -> None:
    workload(docs, "api")["ports"][0]["containerPort"] = 8080


def wrong_metrics_port(docs: list[dict[str, Any]]) -> None:
    workload(docs, "persister")["args"] = ["worker", "persister", "--metrics-port", "9200"]


def argv_that_does_not_parse(docs: list[dict[str, Any]]) -> None:
    workload(docs, "archiver")["args"] = ["worker", "archiver", "--grace-seconds", "60"]


def unknown_command(docs: list[dict[str, Any]]) -> None:
    workload(docs, "migration")["args"] = ["db", "migrate"]


def metrics_on_loopback(docs: list[dict[str, Any]]) -> None:
    config_map(docs)["SECKILL_METRICS_HOST"] = "127.0.0.1"


K8S_MISTAKES: dict[str, tuple[Callable[[list[dict[str, Any]]], None], str]] = {
    "misspelt setting": (misspelt_setting, "SECKILL_DRAIN_SECOND is not a setting"),
    "_FILE of a plain setting": (file_of_a_plain_setting, "SECKILL_LOG_LEVEL_FILE is not a"),
    "bad probe path": (bad_probe_path, "probe path /ready is not served"),
    "API path on a worker": (worker_probe_path_of_the_api, "probe path /readyz is not served"),
    "wrong containerPort": (wrong_container_port, "port 8080 declared"),
    "wrong --metrics-port": (wrong_metrics_port, "the process listens on 9200"),
    "argv that does not parse": (argv_that_does_not_parse, "does not parse"),
    "unknown command": (unknown_command, "seckill db migrate does not parse"),
    "metrics on loopback": (metrics_on_loopback, "SECKILL_METRICS_HOST is not 0.0.0.0"),
}


@pytest.mark.parametrize("mistake", K8S_MISTAKES)
def test_a_mistake_in_the_manifests_is_caught(mistake: str) -> None:
    plant, expected = K8S_MISTAKES[mistake]
    documents = k8s_copy()
    assert problems(k8s_roles(documents)) == []
    plant(documents)
    found = problems(k8s_roles(documents))
    assert any(expected in line for line in found), found


def compose_copy() -> dict[str, Any]:
    return copy.deepcopy(load_compose())


COMPOSE_MISTAKES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "missing setting": (
        lambda c: c["services"]["reaper"].__setitem__(
            "environment", c["services"]["reaper"]["environment"] | {"SECKILL_REAPER_EVERY": "1"}
        ),
        "SECKILL_REAPER_EVERY is not a setting",
    ),
    "bad probe path": (
        lambda c: c["services"]["api"]["healthcheck"].__setitem__(
            "test",
            [*c["services"]["api"]["healthcheck"]["test"][:-1], "http://127.0.0.1:8000/health"],
        ),
        "probe path /health is not served",
    ),
    "wrong published port": (
        lambda c: c["services"]["api"].__setitem__("ports", ["127.0.0.1:8000-8001:8001"]),
        "port 8001 declared",
    ),
    "argv that does not parse": (
        lambda c: c["services"]["persister"].__setitem__("command", ["worker", "persist"]),
        "seckill worker persist does not parse",
    ),
}


@pytest.mark.parametrize("mistake", COMPOSE_MISTAKES)
def test_a_mistake_in_compose_is_caught(mistake: str) -> None:
    plant, expected = COMPOSE_MISTAKES[mistake]
    compose = compose_copy()
    plant(compose)
    found = problems(compose_roles(compose))
    assert any(expected in line for line in found), found


SCHEMA_MISTAKES: dict[str, tuple[Callable[[list[dict[str, Any]]], None], str]] = {
    "misspelt field": (
        lambda d: workload(d, "api").__setitem__(
            "livenesProbe", workload(d, "api").pop("livenessProbe")
        ),
        "livenesProbe",
    ),
    "ServiceMonitor on a missing port": (
        lambda d: next(x for x in d if x["kind"] == "ServiceMonitor")["spec"]["endpoints"][
            0
        ].__setitem__("port", "metric"),
        "port 'metric' not on",
    ),
}


@pytest.mark.parametrize("mistake", SCHEMA_MISTAKES)
def test_a_schema_mistake_is_caught(mistake: str) -> None:
    plant, expected = SCHEMA_MISTAKES[mistake]
    documents = k8s_copy()
    plant(documents)
    found = schema_problems(documents)
    assert any(expected in line for line in found), found


def test_a_compose_schema_mistake_is_caught(tmp_path: Path) -> None:
    broken = tmp_path / "compose.yaml"
    broken.write_text(COMPOSE.read_text().replace("stop_grace_period:", "stop_grace_periode:"))
    checker = Path(sys.executable).with_name("check-jsonschema")
    done = subprocess.run(
        [str(checker), "--builtin-schema", "vendor.compose-spec", str(broken)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode != 0 and "stop_grace_periode" in done.stdout + done.stderr
