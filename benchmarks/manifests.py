"""The deployment's processes as its manifests declare them: each role's command line, plain
environment, ports and probes, read from the rendered Kubernetes manifests (``kubectl
kustomize deploy/k8s/base``) or from ``deploy/compose.yaml``.

``tests/deploy/test_manifests.py`` checks each against the product (settings, CLI, routes,
ports), and ``benchmarks.hosts`` starts its hosts' processes from the base's roles, so the
rehearsal runs the command lines a deployment runs.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S_BASE = DEPLOY / "k8s" / "base"
OVERLAYS = DEPLOY / "k8s" / "overlays"
COMPOSE = DEPLOY / "compose.yaml"
COMPONENT = "app.kubernetes.io/component"
WORKLOADS = ("Deployment", "Job")


class NoKubectl(RuntimeError):
    """No kubectl to render the manifests with (scripts/system-deps installs it)."""


@dataclass(frozen=True, slots=True)
class Role:
    """One process of the deployment as declared: ``argv`` after the image's ``seckill``."""

    source: str  # where it is declared, for messages: "k8s Deployment/seckill-api"
    name: str  # the role: api, persister, reaper, reconciler, archiver, migration
    argv: tuple[str, ...]
    env: dict[str, str]  # plain values; secrets referenced (secretKeyRef) are not among them
    ports: tuple[int, ...] = ()  # the ports it is declared to listen on
    probes: tuple[tuple[str, int], ...] = ()  # (path, port) of each HTTP probe
    secret_env: tuple[str, ...] = ()  # variables set from a Secret
    extra: dict[str, Any] = field(default_factory=dict)

    def plain_env(self) -> dict[str, str]:
        """The environment without the secrets: no ``SECKILL_<NAME>_FILE`` (paths to mounted
        secrets, which another host has elsewhere or not at all)."""
        return {k: v for k, v in self.env.items() if not k.endswith("_FILE")}


def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        raise NoKubectl("no kubectl on PATH: run scripts/system-deps (as root) to install it")
    return found


def render(directory: Path = K8S_BASE) -> list[dict[str, Any]]:
    """``kubectl kustomize DIRECTORY``, parsed: every document it renders."""
    done = subprocess.run(
        [kubectl(), "kustomize", str(directory)], capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise RuntimeError(f"kubectl kustomize {directory}: {done.stderr.strip()}")
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def k8s_roles(documents: list[dict[str, Any]]) -> dict[str, Role]:
    """Each Deployment's and Job's container that runs seckill's image, by its component
    label."""
    config_maps = {
        d["metadata"]["name"]: d.get("data") or {} for d in documents if d["kind"] == "ConfigMap"
    }
    roles = {}
    for doc in documents:
        if doc["kind"] not in WORKLOADS:
            continue
        template = doc["spec"]["template"]
        name = template["metadata"]["labels"][COMPONENT]
        (container,) = template["spec"]["containers"]
        if not runs_seckill(container["image"]):
            continue  # PgBouncer: a server the deployment runs, not one of seckill's roles
        roles[name] = container_role(
            f"k8s {doc['kind']}/{doc['metadata']['name']}", name, container, config_maps
        )
    return roles


def runs_seckill(image: str) -> bool:
    """Is ``image`` (``seckill``, ``REGISTRY/seckill:TAG``, ``REGISTRY/seckill@sha256:...``)
    seckill's own?"""
    return re.sub(r"(@sha256:[0-9a-f]+|:[^/:]+)$", "", image).rsplit("/", 1)[-1] == "seckill"


def container_role(
    source: str, name: str, container: dict[str, Any], config_maps: dict[str, dict[str, str]]
) -> Role:
    env: dict[str, str] = {}
    secret_env = []
    for ref in container.get("envFrom", []):
        if "configMapRef" in ref:
            env |= {k: str(v) for k, v in config_maps[ref["configMapRef"]["name"]].items()}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = str(var["value"])
        elif "secretKeyRef" in var.get("valueFrom", {}):
            secret_env.append(var["name"])
    named = {p["name"]: int(p["containerPort"]) for p in container.get("ports", []) if "name" in p}
    ports = tuple(int(p["containerPort"]) for p in container.get("ports", []))
    probes = []
    for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
        get = container.get(kind, {}).get("httpGet")
        if get is not None:
            port = get["port"]
            probes.append((get["path"], named[port] if isinstance(port, str) else int(port)))
    return Role(
        source, name, tuple(container.get("args", [])), env, ports, tuple(probes),
        tuple(secret_env), extra={"container": container},
    )  # fmt: skip


_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")
_PROBE_URL = re.compile(r"^https?://[^/:]+:(\d+)(/[^?]*)")


def interpolated(value: str, environ: dict[str, str]) -> str:
    """A compose value with ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?error}`` resolved from
    ``environ``; a required variable left unset stands as a placeholder key."""

    def one(match: re.Match[str]) -> str:
        name, op, word = match.group(1), match.group(2) or "", match.group(3) or ""
        if environ.get(name):
            return environ[name]
        if op.endswith("-"):
            return word
        return "required-" + "x" * 32 if op.endswith("?") else ""

    return _INTERPOLATION.sub(one, value)


def compose_roles(
    compose: dict[str, Any], environ: dict[str, str] | None = None
) -> dict[str, Role]:
    """Each service that runs the seckill image (its ``command`` is seckill's argv)."""
    environ = environ or {}
    roles = {}
    for name, service in compose["services"].items():
        if "seckill" not in str(service.get("image", "")):
            continue
        env = {
            k: interpolated(str(v), environ) for k, v in (service.get("environment") or {}).items()
        }
        ports = tuple(int(str(p).rsplit(":", 1)[-1]) for p in service.get("ports", []))
        test = (service.get("healthcheck") or {}).get("test", [])
        probes = tuple(
            (m.group(2), int(m.group(1))) for arg in test if (m := _PROBE_URL.match(str(arg)))
        )
        role_name = "migration" if name == "db-upgrade" else name
        roles[role_name] = Role(
            f"compose service {name}", role_name, tuple(service.get("command", [])), env,
            ports + tuple(port for _, port in probes), probes,
        )  # fmt: skip
    return roles


def load_compose(path: Path = COMPOSE) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(path.read_text())
    return loaded
