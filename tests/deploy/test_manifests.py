"""The compose file and the Kubernetes manifests, checked offline against the product.

Rendered with ``kubectl kustomize`` (the base and every overlay), each Kubernetes document is
validated against the API's schema (``kubernetes-validate``; a ServiceMonitor, a CRD, against
what it refers to), and ``deploy/compose.yaml`` against the compose specification's schema
(``check-jsonschema``'s own copy). Then every process they declare is held to what it runs:
each ``SECKILL_*`` is a setting, each command line parses, each probe path is served and each
port is the one the process listens on. Each check is shown to fail on a copy with one mistake.
"""

from __future__ import annotations

import base64
import copy
import functools
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from benchmarks.manifests import (
    COMPONENT,
    COMPOSE,
    DEPLOY,
    K8S_BASE,
    OVERLAYS,
    Role,
    compose_roles,
    interpolated,
    k8s_roles,
    load_compose,
    render,
)
from seckill.config import SECRET_SETTINGS, Settings
from seckill.domain.configuration import ENV_PREFIX

KUBERNETES_VERSION = "1.30.0"  # the oldest release the manifests promise to apply to
CHECKED_CRDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}
SECKILL = Path(sys.executable).with_name("seckill")
TARGETS = [K8S_BASE, *sorted(p for p in OVERLAYS.iterdir() if p.is_dir())]
WORKER_ROLES = ("persister", "reaper", "reconciler", "archiver", "inlet")
K8S = K8S_BASE.parent
PRODUCTION = OVERLAYS / "production"
SALE_DAY = OVERLAYS / "sale-day"
SECRET_FILES = (
    "redis-url", "database-url", "jwt-secret", "ticket-secret", "payment-secret",
    "pgbouncer-userlist",
)  # fmt: skip
DEPLOY_MD = DEPLOY.parent / "docs" / "operations" / "deploy.md"


def k8s_tree(secret: str = "s") -> Path:
    """A copy of deploy/k8s whose production overlay has its Secret's files (which the
    repository never holds), each ``<secret>-<key>``."""
    root = Path(tempfile.mkdtemp(prefix="seckill-k8s-")) / "k8s"
    shutil.copytree(K8S, root)
    for key in SECRET_FILES:
        (root / "overlays" / "production" / "secrets" / key).write_text(f"{secret}-{key}")
    return root


@functools.cache
def _tree() -> Path:
    return k8s_tree()


@functools.cache
def rendered(target: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize`` of a directory of deploy/k8s, in a copy with the Secret's files."""
    return render(_tree() / target.relative_to(K8S))


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


def listening_ports(role: Role) -> dict[int, str]:
    """The ports the process listens on, as the CLI and the settings decide, and what each
    serves: the API app (``api``), or the metrics listener (``worker``: a worker's, and the
    API's when SECKILL_METRICS_PORT is set)."""
    metrics = role.env.get("SECKILL_METRICS_PORT")
    if role.argv[:1] == ("api",) or role.argv[:1] == ("serve",):
        given = option(role.argv, "--port") or role.env.get("SECKILL_API_PORT")
        ports = {int(given) if given else Settings.model_fields["api_port"].default: "api"}
        return ports | ({int(metrics): "worker"} if metrics else {})
    if role.argv[:1] == ("worker",):
        given = option(role.argv, "--metrics-port") or metrics
        return {int(given): "worker"} if given else {}
    return {}


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
        ports = listening_ports(role)
        listens = ", ".join(map(str, sorted(ports))) or "no port"
        for declared in role.ports:
            if declared not in ports:
                found.append(f"{where}: port {declared} declared, the process listens on {listens}")
        for path, probe_port in role.probes:
            app = ports.get(probe_port)
            if app is None:
                found.append(
                    f"{where}: probe on port {probe_port}, the process listens on {listens}"
                )
            elif not serves(app, path):
                found.append(f"{where}: probe path {path} is not served by the {app} app")
        for app in set(ports.values()) if role.ports or role.probes else ():
            host = "SECKILL_API_HOST" if app == "api" else "SECKILL_METRICS_HOST"
            if role.env.get(host) != "0.0.0.0":
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
            if doc["kind"] == "PrometheusRule":
                found += prometheus_rule_problems(doc)
            else:
                found += service_monitor_problems(doc, services)
            continue
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            found.append(f"{name}: {error.message} at {'.'.join(map(str, error.path))}")
        except kubernetes_validate.SchemaNotFoundError:
            found.append(f"{name}: no schema for {doc['apiVersion']} {doc['kind']}")
    return found


def prometheus_rule_problems(rule: dict[str, Any]) -> list[str]:
    """A PrometheusRule holds groups of rules, each an alert or a record with an expression
    (promtool checks the expressions themselves, in test_observability_assets)."""
    name = f"PrometheusRule/{rule['metadata']['name']}"
    groups = rule.get("spec", {}).get("groups") or []
    found = [] if groups else [f"{name}: no groups"]
    for group in groups:
        for each in group.get("rules") or []:
            if not each.get("expr") or ("alert" in each) == ("record" in each):
                found.append(f"{name}: {each} is neither an alert nor a record with an expr")
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
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {f"seckill-{name}" for name in ("api", *WORKER_ROLES)} | {
        "redis-exporter",
        "postgres-exporter",
        "alertmanager",
    }
    # The rules aggregate by namespace: every job gives its targets one.
    for name, job in jobs.items():
        assert {"target_label": "namespace", "replacement": "seckill"} in job.get(
            "relabel_configs", []
        ), name
    (alertmanagers,) = config["alerting"]["alertmanagers"]
    services = load_compose()["services"]
    for target in alertmanagers["static_configs"][0]["targets"]:
        assert target.split(":")[0] in services, target
    for name in ("redis-exporter", "postgres-exporter", "alertmanager"):
        for target in jobs[name]["static_configs"][0]["targets"]:
            assert target.split(":")[0] in services, target


def alertmanager_problems(compose: dict[str, Any], tmp: Path) -> list[str]:
    """Alertmanager's configuration (compose's `configs.alertmanager`, the webhook's address
    given) passes ``amtool check-config``, and sends every alert to ALERT_WEBHOOK_URL."""
    content = compose["configs"]["alertmanager"]["content"]
    url = "https://pager.example/hook"
    path = tmp / "alertmanager.yml"
    path.write_text(interpolated(content, {"ALERT_WEBHOOK_URL": url}))
    amtool = shutil.which("amtool")
    if amtool is None:
        return [
            "amtool is not installed: scripts/system-deps installs it (prometheus-alertmanager)"
        ]
    done = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True)
    if done.returncode:
        return [f"amtool check-config: {done.stdout}{done.stderr}"]
    config = yaml.safe_load(path.read_text())
    receivers = {r["name"]: r for r in config["receivers"]}
    hooks = [h["url"] for h in receivers[config["route"]["receiver"]].get("webhook_configs", [])]
    if hooks != [url]:
        return [f"the root route's receiver sends to {hooks}, not ALERT_WEBHOOK_URL"]
    if "${ALERT_WEBHOOK_URL:?" not in content:
        return ["ALERT_WEBHOOK_URL is not required: alerts could go nowhere"]
    return []


def test_compose_sends_alerts_to_the_webhook_a_person_sets(tmp_path: Path) -> None:
    compose = load_compose()
    assert alertmanager_problems(compose, tmp_path) == []
    assert "alertmanager" in compose["services"]
    planted = compose_copy()
    planted["configs"]["alertmanager"]["content"] = planted["configs"]["alertmanager"][
        "content"
    ].replace("receiver: on-call", "receiver: nobody")
    assert alertmanager_problems(planted, tmp_path)


def test_compose_bounds_memory_and_restarts_what_stops() -> None:
    compose = load_compose()
    services = compose["services"]
    for name, service in services.items():
        assert service.get("mem_limit"), f"{name}: no memory limit"
        if name not in ("db-upgrade", "redis-cluster-init"):
            assert service.get("restart") == "unless-stopped", f"{name}: not restarted"
    for name in ("redis", "redis-node-1", "redis-node-2", "redis-node-3"):
        command = services[name]["command"]
        policy = command[command.index("--maxmemory-policy") + 1]
        assert policy == "noeviction", f"{name}: an evicted key is a lost sale"
        maxmemory = interpolated(command[command.index("--maxmemory") + 1], {})
        assert int(maxmemory.removesuffix("gb")) * 1024 < int(
            services[name]["mem_limit"].removesuffix("m")
        ), f"{name}: maxmemory {maxmemory} does not fit its container"
    images = {service.get("image", "").split(":")[0] for service in services.values()}
    assert {"oliver006/redis_exporter", "quay.io/prometheuscommunity/postgres-exporter"} <= images


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
        secrets = [d for d in documents if d["kind"] == "Secret"]
        if target in (PRODUCTION, SALE_DAY):  # generated from the files beside the overlay
            (secret,) = secrets
            assert {
                key: base64.b64decode(value).decode() for key, value in secret["data"].items()
            } == {key: f"s-{key}" for key in SECRET_FILES}
        else:
            assert not secrets, target
        for role in k8s_roles(documents).values():
            for name in SECRET_SETTINGS:
                variable = ENV_PREFIX + name.upper()
                assert variable not in role.env, f"{role.source}: {variable} inlined"
    kept = subprocess.run(
        ["git", "ls-files", str(PRODUCTION / "secrets")],
        capture_output=True, text=True, check=True, cwd=DEPLOY.parent,
    ).stdout.split()  # fmt: skip
    assert kept == ["deploy/k8s/overlays/production/secrets/.gitignore"], kept
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


# -- the first deploy, as deploy.md writes it ------------------------------------------------

_TERM = re.compile(
    r"\s*([\w./-]+)\s*(?:(!=|==|=)\s*([\w.-]*)|\s+(in|notin)\s*\(([^)]*)\))\s*(?:,|$)"
)


def selects(selector: str, labels: dict[str, str]) -> bool:
    """Whether a kubectl label selector (``k=v``, ``k!=v``, ``k in (a,b)``, ``k notin (a)``,
    comma-joined) selects an object with ``labels``, as the API server decides."""
    position = 0
    while position < len(selector):
        term = _TERM.match(selector, position)
        assert term, f"cannot read the selector {selector!r} at {selector[position:]!r}"
        key, op, value, set_op, values = term.groups()
        have = labels.get(key)
        if op in ("=", "=="):
            ok = have == value
        elif op == "!=":
            ok = have != value  # an object without the key is selected
        else:
            chosen = {v.strip() for v in values.split(",")}
            ok = have in chosen if set_op == "in" else have not in chosen
        if not ok:
            return False
        position = term.end()
    return True


def labels_of(doc: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = doc["metadata"].get("labels") or {}
    return labels


def documented_applies() -> list[tuple[Path, str | None]]:
    """Each ``kubectl apply -k DIR [-l SELECTOR]`` of deploy.md, in order."""
    found = []
    for match in re.finditer(
        r"kubectl apply -k (\S+)(?: -l (?:'([^']+)'|(\S+)))?", DEPLOY_MD.read_text()
    ):
        found.append((DEPLOY.parent / match.group(1), match.group(2) or match.group(3)))
    return found


def references(doc: dict[str, Any]) -> set[tuple[str, str]]:
    """(kind, name) of what a workload's pods need to start: ConfigMaps and Secrets (as
    environment and volumes) and their PriorityClass."""
    spec = doc["spec"]["template"]["spec"]
    found = set()
    if "priorityClassName" in spec:
        found.add(("PriorityClass", spec["priorityClassName"]))
    for volume in spec.get("volumes", []):
        if "secret" in volume:
            found.add(("Secret", volume["secret"]["secretName"]))
        if "configMap" in volume:
            found.add(("ConfigMap", volume["configMap"]["name"]))
    for container in spec["containers"]:
        for ref in container.get("envFrom", []):
            for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
                if key in ref:
                    found.add((kind, ref[key]["name"]))
    return found


def migration_step_misses(documents: list[dict[str, Any]], selector: str) -> list[str]:
    """What the migration Job needs that ``kubectl apply -l SELECTOR`` leaves out (besides the
    Secret made by hand, where the overlay generates none)."""
    chosen = {
        (d["kind"], d["metadata"]["name"]) for d in documents if selects(selector, labels_of(d))
    }
    present = {(d["kind"], d["metadata"]["name"]) for d in documents}
    jobs = [d for d in documents if d["kind"] == "Job"]
    if not any(kind == "Job" for kind, _ in chosen):
        return [f"{selector!r} selects no Job"]
    return [
        f"{kind}/{name}: the Job needs it, {selector!r} does not select it"
        for job in jobs
        for kind, name in sorted(references(job))
        if (kind, name) in present and (kind, name) not in chosen
    ]


def test_the_documented_migration_step_applies_everything_the_job_needs() -> None:
    applies = documented_applies()
    migrations = [(d, s) for d, s in applies if s and "migration" in s and "!=" not in s]
    assert migrations, "deploy.md has no migration step (kubectl apply -k ... -l ...migration...)"
    for directory, selector in migrations:
        assert selector is not None
        documents = rendered(directory)
        assert migration_step_misses(documents, selector) == [], (directory, selector)
    # Against production, where the Secret is generated too: it is selected with the Job.
    production = rendered(PRODUCTION)
    selector = migrations[0][1]
    assert selector is not None
    assert migration_step_misses(production, selector) == []
    needs = {kind for job in production if job["kind"] == "Job" for kind, _ in references(job)}
    assert needs == {"ConfigMap", "Secret", "PriorityClass"}


def test_the_documented_full_apply_leaves_the_job_and_takes_the_rest() -> None:
    """After the migration, the rest is applied without the Job (whose pod template cannot
    change) and with every Deployment."""
    for directory, selector in documented_applies():
        if selector is None or "!=" not in selector:
            continue
        documents = rendered(directory)
        chosen = [d for d in documents if selects(selector, labels_of(d))]
        assert not [d for d in chosen if d["kind"] == "Job"], selector
        assert {d["metadata"]["name"] for d in chosen if d["kind"] == "Deployment"} == {
            d["metadata"]["name"] for d in documents if d["kind"] == "Deployment"
        }


def test_a_migration_step_missing_the_config_map_is_caught() -> None:
    documents = k8s_copy()
    selector = "app.kubernetes.io/component in (config,migration)"
    assert migration_step_misses(documents, selector) == []
    config = next(d for d in documents if d["kind"] == "ConfigMap")
    assert migration_step_misses(documents, "app.kubernetes.io/component=migration") == [
        f"ConfigMap/{config['metadata']['name']}: the Job needs it, "
        "'app.kubernetes.io/component=migration' does not select it",
        "PriorityClass/seckill: the Job needs it, "
        "'app.kubernetes.io/component=migration' does not select it",
    ]
    del config["metadata"]["labels"]["app.kubernetes.io/component"]
    assert any("ConfigMap/" in line for line in migration_step_misses(documents, selector))


def test_label_selectors_read_as_kubectl_does() -> None:
    labels = {"app.kubernetes.io/component": "config", "tier": "x"}
    assert selects("app.kubernetes.io/component in (config, migration)", labels)
    assert not selects("app.kubernetes.io/component=migration", labels)
    assert selects("app.kubernetes.io/component!=migration", labels)
    assert selects("app.kubernetes.io/component!=migration", {})
    assert not selects("tier=x,app.kubernetes.io/component notin (config)", labels)


# -- what keeps a deployment up --------------------------------------------------------------


def scaled_by_an_autoscaler(documents: list[dict[str, Any]]) -> list[str]:
    """Deployments that set ``replicas`` while an HPA scales them: each apply resets it."""
    targets = {
        d["spec"]["scaleTargetRef"]["name"]
        for d in documents
        if d["kind"] == "HorizontalPodAutoscaler"
    }
    return [
        f"Deployment/{d['metadata']['name']}: replicas {d['spec']['replicas']} beside its HPA"
        for d in documents
        if d["kind"] == "Deployment"
        and d["metadata"]["name"] in targets
        and "replicas" in d["spec"]
    ]


@pytest.mark.parametrize("target", TARGETS, ids=lambda p: p.name)
def test_no_replicas_beside_an_autoscaler(target: Path) -> None:
    documents = rendered(target)
    assert [d for d in documents if d["kind"] == "HorizontalPodAutoscaler"]
    assert scaled_by_an_autoscaler(documents) == []
    planted = copy.deepcopy(documents)
    next(
        d for d in planted if d["metadata"]["name"] == "seckill-api" and d["kind"] == "Deployment"
    )["spec"]["replicas"] = 2
    assert scaled_by_an_autoscaler(planted) == ["Deployment/seckill-api: replicas 2 beside its HPA"]


def by_kind(documents: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in documents if d["kind"] == kind}


def test_sale_day_raises_the_floor_before_the_doors_open() -> None:
    normal, sale = rendered(PRODUCTION), rendered(SALE_DAY)
    before = by_kind(normal, "HorizontalPodAutoscaler")["seckill-api"]["spec"]
    during = by_kind(sale, "HorizontalPodAutoscaler")["seckill-api"]["spec"]
    assert during["minReplicas"] >= 5 * before["minReplicas"]
    assert during["maxReplicas"] >= during["minReplicas"]
    persisters = (by_kind(d, "Deployment")["seckill-persister"]["spec"] for d in (normal, sale))
    assert next(persisters)["replicas"] < next(persisters)["replicas"]
    assert "sale-day" in DEPLOY_MD.read_text()


def test_a_changed_secret_or_setting_rolls_every_pod() -> None:
    """The ConfigMap and the Secret carry a hash of their content in their names, and each pod
    template refers to them by it: a changed key is a changed template, a rollout."""
    first = rendered(PRODUCTION)
    other = render(k8s_tree(secret="rotated") / "overlays" / "production")
    generated = {
        (d["kind"], d["metadata"]["name"]) for d in first if d["kind"] in ("ConfigMap", "Secret")
    }
    assert {kind for kind, _ in generated} == {"ConfigMap", "Secret"}
    templates = [
        {d["metadata"]["name"]: d["spec"]["template"] for d in docs if d["kind"] == "Deployment"}
        for docs in (first, other)
    ]
    for name, template in templates[0].items():
        needs = references({"spec": {"template": template}})
        assert {ref for ref in needs if ref[0] in ("ConfigMap", "Secret")} <= generated, name
        assert templates[1][name] != template, f"{name} does not roll when the Secret changes"


def test_api_and_persisters_spread_across_nodes_and_keep_a_budget() -> None:
    documents = rendered(K8S_BASE)
    deployments = by_kind(documents, "Deployment")
    budgets = by_kind(documents, "PodDisruptionBudget")
    for name in ("seckill-api", "seckill-persister"):
        template = deployments[name]["spec"]["template"]
        pod_labels = template["metadata"]["labels"]
        spread = template["spec"]["topologySpreadConstraints"]
        on_nodes = [c for c in spread if c["topologyKey"] == "kubernetes.io/hostname"]
        assert on_nodes and on_nodes[0]["whenUnsatisfiable"] == "DoNotSchedule", name
        for constraint in spread:
            assert constraint["labelSelector"]["matchLabels"].items() <= pod_labels.items()
        budget = [
            b for b in budgets.values()
            if b["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
        ]  # fmt: skip
        assert budget and budget[0]["spec"].get("maxUnavailable") == 1, name
    classes = by_kind(documents, "PriorityClass")
    for doc in documents:
        if doc["kind"] in ("Deployment", "Job"):
            assert doc["spec"]["template"]["spec"].get("priorityClassName") in classes, doc
    (job,) = by_kind(documents, "Job").values()
    assert 0 < job["spec"]["ttlSecondsAfterFinished"] <= 7 * 86400


_DIGEST = re.compile(r"^[\w.:/-]+@sha256:[0-9a-f]{64}$")


@pytest.mark.parametrize("target", [PRODUCTION, SALE_DAY], ids=lambda p: p.name)
def test_production_runs_the_image_by_digest(target: Path) -> None:
    for doc in rendered(target):
        if doc["kind"] in ("Deployment", "Job"):
            for container in doc["spec"]["template"]["spec"]["containers"]:
                assert _DIGEST.match(container["image"]), container["image"]
    assert not _DIGEST.match("registry.example.com/seckill:0.1.0")


def test_monitoring_objects_carry_the_release_label_from_one_place() -> None:
    documents = rendered(K8S_BASE)
    monitoring = [d for d in documents if d["apiVersion"].startswith("monitoring.coreos.com/")]
    assert {d["kind"] for d in monitoring} == {"ServiceMonitor", "PrometheusRule"}
    releases = {labels_of(d).get("release") for d in monitoring}
    assert len(releases) == 1 and None not in releases, releases
    (release,) = releases
    assert (K8S_BASE / "kustomization.yaml").read_text().count(f"value: {release}") == 1
    for name in (K8S_BASE / "monitoring.yaml", K8S_BASE / "prometheusrule.yaml"):
        assert "release:" not in name.read_text(), f"{name}: set the release label in one place"


# -- who may reach what ----------------------------------------------------------------------

BUYERS = {"kubernetes.io/metadata.name": "shop-frontend"}
MONITORING = {"kubernetes.io/metadata.name": "monitoring"}


def reachable(documents: list[dict[str, Any]], source: dict[str, str]) -> set[tuple[str, int]]:
    """(component, port) of every container port a pod in a namespace labelled ``source``
    may reach, under the rendered NetworkPolicies (ingress; pods of other namespaces)."""
    policies = [d for d in documents if d["kind"] == "NetworkPolicy"]
    found = set()
    for doc in documents:
        if doc["kind"] not in ("Deployment", "Job"):
            continue
        labels = doc["spec"]["template"]["metadata"]["labels"]
        ports = {
            p.get("name", str(p["containerPort"])): int(p["containerPort"])
            for c in doc["spec"]["template"]["spec"]["containers"]
            for p in c.get("ports", [])
        }
        chosen = [
            p for p in policies
            if p["spec"]["podSelector"].get("matchLabels", {}).items() <= labels.items()
            and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
        ]  # fmt: skip
        for name, number in ports.items():
            if not chosen or any(
                admits(rule, source, name, number)
                for policy in chosen
                for rule in policy["spec"].get("ingress", [])
            ):
                found.add((labels[COMPONENT], number))
    return found


def admits(rule: dict[str, Any], source: dict[str, str], name: str, number: int) -> bool:
    peers = rule.get("from")
    if peers is not None and not any(
        "namespaceSelector" in peer
        and "podSelector" not in peer
        and peer["namespaceSelector"].get("matchLabels", {}).items() <= source.items()
        for peer in peers
    ):
        return False
    ports = rule.get("ports")
    return ports is None or any(p.get("port") in (name, number) for p in ports)


def test_buyers_reach_the_api_port_only_and_monitoring_the_metrics_ports() -> None:
    documents = rendered(K8S_BASE)
    assert reachable(documents, BUYERS) == {("api", 8000)}
    assert reachable(documents, MONITORING) == {("api", 8000), ("api", 9100)} | {
        (name, 9100) for name in WORKER_ROLES
    }
    # The metrics policy open to every source: a buyer reaches every worker's metrics.
    planted = copy.deepcopy(documents)
    opened = next(d for d in planted if d["metadata"]["name"] == "seckill-metrics")
    del opened["spec"]["ingress"][0]["from"]
    assert ("persister", 9100) in reachable(planted, BUYERS)
