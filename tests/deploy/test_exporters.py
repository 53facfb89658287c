"""The exporters the alert rules read, run for real: every series an alert or recording rule of
``deploy/prometheus/alerts.yaml`` selects from redis_exporter (``redis_*``) or postgres_exporter
(``pg_*``) is one that exporter exports, with the labels the rule selects on or aggregates by.

Each exporter is Debian's package (``scripts/system-deps --ci`` installs both; compose runs the
upstream images), started on a free loopback port against a real server: a Redis this module
starts with a ``maxmemory`` (what SeckillRedisMemoryHigh divides by), and the PostgreSQL of
``SECKILL_TEST_POSTGRES_URL``. Its ``/metrics`` is scraped once and every rule checked against
it. ``namespace``, ``instance`` and ``job`` are left out of the label check: Prometheus's scrape
configuration sets them, not the exporter. A rule naming a series the exporter lacks (or a label
it does not give that series) is shown to fail on a copy of the rules.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from seckill.redis_server import RedisServer
from tests.deploy.test_observability_assets import _AGGREGATION, _STRING, REPO, metric_names

ALERTS = REPO / "deploy/prometheus/alerts.yaml"
# Set by the scrape (compose's relabelling, the Prometheus Operator, Prometheus itself).
SCRAPE_LABELS = frozenset({"namespace", "instance", "job"})
MAXMEMORY = 64 * 1024 * 1024
POSTGRES_URL = os.environ.get("SECKILL_TEST_POSTGRES_URL", "")


@dataclass(frozen=True)
class Exporter:
    name: str  # as the rules' comments and compose call it
    binary: str  # Debian's
    prefix: str  # of every series it exports


REDIS = Exporter("redis_exporter", "prometheus-redis-exporter", "redis_")
POSTGRES = Exporter("postgres_exporter", "prometheus-postgres-exporter", "pg_")

# -- What the rules read from an exporter ---------------------------------------------------------


def _blank_strings(expr: str) -> str:
    """The expression with each string's contents replaced by ``x`` (same length, so positions
    hold; an empty string stays empty)."""
    return _STRING.sub(lambda m: m[0][0] + "x" * (len(m[0]) - 2) + m[0][-1], expr)


def _closing(text: str, opening: int) -> int:
    """The index of the parenthesis closing the one at ``opening``."""
    depth = 0
    for index in range(opening, len(text)):
        depth += {"(": 1, ")": -1}.get(text[index], 0)
        if depth == 0:
            return index
    raise ValueError(f"unbalanced parentheses: {text!r}")


_MATCHER = re.compile(r'([A-Za-z_]\w*)\s*(=~|!~|!=|=)\s*"(x*)"')
_TRAILING_BY = re.compile(r"\s*by\s*\(([^()]*)\)")


def labels_read(expr: str, prefix: str) -> dict[str, set[str]]:
    """Each ``prefix*`` metric an expression selects -> the labels the series must carry: those
    its matchers require (``=`` or ``=~`` to a non-empty value) and those of every ``by (...)``
    of an aggregation around it, less the ones the scrape sets. (``on``/``ignoring`` lists and
    ``label_replace`` sources are not followed.)"""
    text = _blank_strings(expr)
    names = {name for name in metric_names(expr) if name.startswith(prefix)}
    selector = re.compile(
        r"(?<![\w:])(" + "|".join(map(re.escape, sorted(names))) + r")(?![\w:])\s*(\{[^{}]*\})?"
    )
    found: dict[str, set[str]] = {name: set() for name in names}
    if not names:
        return found
    selections = []
    for match in selector.finditer(text):
        required = {
            label
            for label, operator, value in _MATCHER.findall(match[2] or "")
            if operator in ("=", "=~") and value
        }
        found[match[1]] |= required
        selections.append((match.start(), match[1]))
    for aggregation in _AGGREGATION.finditer(text):
        opening = aggregation.end() - 1
        closing = _closing(text, opening)
        by = aggregation[3] if aggregation[2] == "by" else None
        if aggregation[2] is None and (trailing := _TRAILING_BY.match(text, closing + 1)):
            by = trailing[1]
        if by is None:
            continue
        labels = {label.strip() for label in by.split(",") if label.strip()}
        for position, name in selections:
            if opening < position < closing:
                found[name] |= labels
    return {name: labels - SCRAPE_LABELS for name, labels in found.items()}


def rules(path: Path) -> Iterator[dict[str, Any]]:
    for group in yaml.safe_load(path.read_text())["groups"]:
        yield from group["rules"]


def read_by_rules(path: Path, exporter: Exporter) -> dict[str, set[str]]:
    """Every ``prefix*`` series the rules of ``path`` read -> the labels they need of it."""
    needed: dict[str, set[str]] = {}
    for rule in rules(path):
        for name, labels in labels_read(rule["expr"], exporter.prefix).items():
            needed.setdefault(name, set()).update(labels)
    return needed


def not_exported(path: Path, exporter: Exporter, exported: dict[str, set[str]]) -> list[str]:
    """What the rules of ``path`` read that the exporter's scrape (sample name -> the labels its
    samples carry) lacks: [] when it has everything."""
    problems = []
    for rule in rules(path):
        what = f"{'alert' if 'alert' in rule else 'record'} {rule.get('alert') or rule['record']}"
        for name, labels in sorted(labels_read(rule["expr"], exporter.prefix).items()):
            if name not in exported:
                problems.append(f"{what}: {name} is not exported by {exporter.name}")
            elif missing := sorted(labels - exported[name]):
                problems.append(
                    f"{what}: {exporter.name}'s {name} has no label {', '.join(missing)}"
                )
    return problems


def test_labels_are_read_from_promql() -> None:
    assert labels_read(
        "max by (namespace, instance) (redis_memory_used_bytes / (redis_memory_max_bytes > 0))",
        "redis_",
    ) == {"redis_memory_used_bytes": set(), "redis_memory_max_bytes": set()}
    assert labels_read(
        'sum(rate(pg_stat_database_xact_rollback{datname=~"seckill|x", server!=""}[5m])) '
        'by (namespace, datname) > 0 and on (namespace) max(pg_up{job="pg"}) < 1 '
        'or sum by (mode) (pg_locks_count{datname=""}) > seckill_x',
        "pg_",
    ) == {
        "pg_stat_database_xact_rollback": {"datname"},
        "pg_up": set(),
        "pg_locks_count": {"mode"},
    }
    assert labels_read("max by (namespace) (seckill_refunds_owed) > 0", "redis_") == {}


# -- The exporters, run --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def exporter_binary(exporter: Exporter) -> str:
    found = shutil.which(exporter.binary)
    if found is None:
        message = (
            f"{exporter.binary} is not installed: `scripts/system-deps --ci` installs it "
            f"(Debian's {exporter.binary} package)"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


_SAMPLE = re.compile(r"([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?")  # [timestamp]
_LABEL = re.compile(r'([A-Za-z_]\w*)\s*=\s*"(?:\\.|[^"\\])*"')


def samples(url: str) -> Iterator[tuple[str, set[str], float]]:
    """(name, label names, value) of each sample of a text exposition, read as Prometheus reads
    it: names as written (prometheus_client's parser would add ``_total`` to a counter's)."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            match = _SAMPLE.fullmatch(line.strip())
            assert match, f"not a sample line: {line!r}"
            yield match[1], set(_LABEL.findall(match[2] or "")), float(match[3])


def scrape(url: str) -> dict[str, set[str]]:
    """Sample name -> the label names its samples carry."""
    exported: dict[str, set[str]] = {}
    for name, labels, _ in samples(url):
        exported.setdefault(name, set()).update(labels)
    return exported


def value(url: str, name: str) -> float:
    for sample, _, number in samples(url):
        if sample == name:
            return number
    raise AssertionError(f"{name} is not in {url}")


@contextmanager
def run_exporter(args: list[str], env: dict[str, str], up: str, tmp: Path) -> Iterator[str]:
    """Starts an exporter, waits until its /metrics says ``up`` is 1 (the server was reached),
    gives its metrics URL, and stops it."""
    log = tmp / "exporter.log"
    with log.open("wb") as output:
        process = subprocess.Popen(args, env=env, stdout=output, stderr=subprocess.STDOUT)
    port = args[-1].rsplit(":", 1)[1]
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                pytest.fail(f"{args[0]} exited with {process.returncode}: {log.read_text()}")
            try:
                if value(url, up) == 1:
                    break
            except (urllib.error.URLError, ConnectionError, AssertionError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"{args[0]}: {up} is not 1 after 30 s: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def redis_metrics(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = exporter_binary(REDIS)
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        pytest.fail("no redis-server on PATH (scripts/system-deps installs it)")
    tmp = tmp_path_factory.mktemp("redis-exporter")
    server = RedisServer(
        binary=redis_server,
        port=free_port(),
        data_dir=tmp / "redis",
        extra_args=["--maxmemory", str(MAXMEMORY), "--maxmemory-policy", "noeviction"],
    ).start()
    try:
        with redis.Redis.from_url(server.url) as client:  # a key: db0 has a keyspace line
            client.set("seckill:exporter-test", "1")
        args = [binary, "-redis.addr", f"redis://127.0.0.1:{server.port}"]
        args += ["-web.listen-address", f"127.0.0.1:{free_port()}"]
        env = {"PATH": os.environ.get("PATH", "")}  # no REDIS_* of the caller's
        with run_exporter(args, env, "redis_up", tmp) as url:
            yield url
    finally:
        server.stop()


def _libpq(url: str) -> str:
    """SQLAlchemy's URL as libpq's (postgres_exporter's DATA_SOURCE_NAME), without TLS."""
    url = re.sub(r"^postgresql\+\w+://", "postgresql://", url)
    return url + ("&" if "?" in url else "?") + "sslmode=disable"


@pytest.fixture(scope="module")
def postgres_metrics(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = exporter_binary(POSTGRES)
    if not POSTGRES_URL:
        if os.environ.get("CI"):
            pytest.fail("SECKILL_TEST_POSTGRES_URL is not set (.ci/run sets it)")
        pytest.skip("set SECKILL_TEST_POSTGRES_URL (postgresql+asyncpg://postgres@127.0.0.1/...)")
    tmp = tmp_path_factory.mktemp("postgres-exporter")
    args = [binary, f"--web.listen-address=127.0.0.1:{free_port()}"]
    env = {"PATH": os.environ.get("PATH", ""), "DATA_SOURCE_NAME": _libpq(POSTGRES_URL)}
    with run_exporter(args, env, "pg_up", tmp) as url:
        yield url


@pytest.fixture(params=[REDIS, POSTGRES], ids=lambda e: e.name)
def exported(request: pytest.FixtureRequest) -> tuple[Exporter, dict[str, set[str]]]:
    exporter: Exporter = request.param
    fixture = "redis_metrics" if exporter is REDIS else "postgres_metrics"
    return exporter, scrape(request.getfixturevalue(fixture))


# -- The checks --------------------------------------------------------------------------------


def test_redis_exporter_reads_its_server(redis_metrics: str) -> None:
    """Up, with the maxmemory the memory alerts divide by (0 would leave them silent)."""
    assert value(redis_metrics, "redis_up") == 1
    assert value(redis_metrics, "redis_memory_max_bytes") == MAXMEMORY
    assert value(redis_metrics, "redis_memory_used_bytes") > 0


def test_postgres_exporter_reads_its_server(postgres_metrics: str) -> None:
    assert value(postgres_metrics, "pg_up") == 1


def test_the_rules_read_only_what_the_exporter_exports(
    exported: tuple[Exporter, dict[str, set[str]]],
) -> None:
    exporter, series = exported
    assert not_exported(ALERTS, exporter, series) == []
    if exporter is REDIS:  # the memory alerts: the check is not vacuous
        assert {"redis_memory_used_bytes", "redis_memory_max_bytes"} <= read_by_rules(
            ALERTS, exporter
        ).keys()


def _with_rule(tmp: Path, expr: str) -> Path:
    """A copy of the rules with one more alert."""
    document = yaml.safe_load(ALERTS.read_text())
    document["groups"].append(
        {
            "name": "planted",
            "rules": [{"alert": "SeckillPlanted", "expr": expr, "for": "1m"}],
        }
    )
    copy = tmp / "alerts.yaml"
    copy.write_text(yaml.safe_dump(document, sort_keys=False))
    return copy


# (what is wrong, the exporter, the planted rule, what the report must name)
PLANTED = [
    ("a name the exporter does not have", REDIS,
     "max by (namespace) (redis_memory_used_ratio) > 0.8",
     "alert SeckillPlanted: redis_memory_used_ratio is not exported by redis_exporter"),
    ("a counter read without the _total its exporter adds", REDIS,
     "max by (namespace) (rate(redis_evicted_keys[5m])) > 0",
     "redis_evicted_keys is not exported"),
    ("a counter read with _total its exporter does not add", POSTGRES,
     "sum by (namespace) (rate(pg_stat_database_xact_rollback_total[5m])) > 0",
     "pg_stat_database_xact_rollback_total is not exported by postgres_exporter"),
    ("a label the series lacks", REDIS,
     'max by (namespace, datname) (redis_memory_used_bytes{role="master"}) > 0',
     "redis_exporter's redis_memory_used_bytes has no label datname, role"),
    ("a label the series lacks, aggregated after", POSTGRES,
     "max(pg_up) by (namespace, mode) < 1",
     "postgres_exporter's pg_up has no label mode"),
]  # fmt: skip

# Rules the exporters do satisfy, labels and all: the check does not refuse everything.
SATISFIED = [
    (POSTGRES, 'sum by (namespace, datname) (pg_stat_database_numbackends{datname="x"}) > 90'),
    (POSTGRES, "max by (namespace, mode) (pg_locks_count) > 100"),
    (REDIS, 'max by (namespace, db) (redis_db_keys{db="db0"}) > 1e7'),
    (REDIS, "sum by (namespace) (rate(redis_evicted_keys_total[5m])) > 0"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("exporter", "expr", "named"),
    [pytest.param(exporter, expr, named, id=what) for what, exporter, expr, named in PLANTED],
)
def test_a_planted_rule_is_caught(
    exporter: Exporter, expr: str, named: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    fixture = "redis_metrics" if exporter is REDIS else "postgres_metrics"
    series = scrape(request.getfixturevalue(fixture))
    assert not_exported(ALERTS, exporter, series) == [], "the copy passes before the planting"
    problems = not_exported(_with_rule(tmp_path, expr), exporter, series)
    assert problems, f"{expr} was not caught"
    assert named in "\n".join(problems), problems


@pytest.mark.parametrize(("exporter", "expr"), SATISFIED, ids=lambda v: getattr(v, "name", v))
def test_a_rule_the_exporter_satisfies_passes(
    exporter: Exporter, expr: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    fixture = "redis_metrics" if exporter is REDIS else "postgres_metrics"
    series = scrape(request.getfixturevalue(fixture))
    assert not_exported(_with_rule(tmp_path, expr), exporter, series) == []
