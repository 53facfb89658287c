"""The alert rules and the Grafana dashboard, checked offline against the product.

``promtool`` checks ``deploy/prometheus/alerts.yaml`` and runs its unit tests (every
``deploy/prometheus/*_test.yaml``); every metric an alert or a panel queries is one that
``seckill.observability.metrics`` exposes (the names derived from its metric objects, with the
suffixes prometheus_client adds), a rule of the file records, or one of the few others named
here (Prometheus's ``up``, redis_exporter's); every aggregation keeps ``namespace``, so that two
deployments in one Prometheus alert apart; every alert says how long, how bad and where its
runbook section is, and that section exists; every alert is fired by a unit test and kept
quiet by one; the PrometheusRule in ``deploy/k8s/base`` holds the very same rules. Each check
is shown to fail on a copy with one mistake planted.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

from seckill.observability import metrics

REPO = Path(__file__).resolve().parents[2]
RULES_DIR = Path("deploy/prometheus")
ALERTS = RULES_DIR / "alerts.yaml"
PROMETHEUS_RULE = Path("deploy/k8s/base/prometheusrule.yaml")
GENERATOR = RULES_DIR / "prometheusrule.py"
# Series the rules read that seckill does not expose: Prometheus's own and redis_exporter's
# (the exporter beside Redis in deploy/compose.yaml).
OTHER_METRICS = frozenset({"up", "redis_memory_used_bytes", "redis_memory_max_bytes"})
DASHBOARD = Path("deploy/grafana/seckill.json")
RUNBOOK = Path("docs/runbook.md")
SEVERITIES = {"critical", "warning"}
VARIABLE_SOURCE = {"type": "prometheus", "uid": "${datasource}"}

# -- What the code exposes ---------------------------------------------------------------------

# The sample names prometheus_client writes for a family of each type (``_created`` only
# outside multi-process mode, but a query may use it).
_SAMPLES: dict[str, tuple[str, ...]] = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "enum": ("",),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
}


def exposed_names() -> frozenset[str]:
    """Every sample name the metrics module's objects expose (``seckill_shed_total``,
    ``seckill_http_request_duration_seconds_bucket``...), read from the objects themselves."""
    names: set[str] = set()
    for obj in vars(metrics).values():
        if isinstance(obj, MetricWrapperBase):
            for family in obj.describe():
                names.update(family.name + suffix for suffix in _SAMPLES[family.type])
    return frozenset(names)


# -- PromQL: the metric names an expression reads ------------------------------------------------

_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_NAME_MATCHER = re.compile(r'__name__\s*=\s*("(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\')')
_GRAFANA_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")  # ${datasource}, $__rate_interval, $item
_LABEL_VALUES = re.compile(r"\blabel_values\s*\(([^()]*?)(?:,\s*\w+\s*)?\)")  # Grafana's
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENTIFIER = re.compile(r"(?<![\w.:])[A-Za-z_:][\w:]*")
_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
     "group_left", "group_right", "inf", "nan", "atan2", "start", "end"}
)  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (or a Grafana query) selects: what is left of it
    once strings, label matchers, ranges, label lists, Grafana's variables, numbers and
    durations are taken out, less keywords and the functions (any name followed by ``(``)."""
    found = {m[1:-1] for m in _NAME_MATCHER.findall(expr)}
    text = _LABEL_VALUES.sub(r"\1", expr)
    text = _STRING.sub('""', text)
    text = _GRAFANA_VARIABLE.sub("5m", text)
    previous = None
    while previous != text:  # matchers hold no braces once strings are out
        previous, text = text, _MATCHERS.sub(" ", _RANGE.sub(" ", text))
    text = _LABEL_LIST.sub(" ", text)
    for match in _IDENTIFIER.finditer(text):
        name = match.group()
        if text[match.end() :].lstrip().startswith("(") or name.lower() in _KEYWORDS:
            continue  # a function, an aggregation, or a keyword
        found.add(name)
    return found


def test_metric_names_are_read_from_promql() -> None:
    assert metric_names(
        'histogram_quantile(0.99, sum by (le) (rate(seckill_x_bucket{route="/a/{id}/b", '
        'le!="+Inf"}[$__rate_interval])))'
    ) == {"seckill_x_bucket"}
    assert metric_names(
        "sum without (instance) (a_total offset 5m) / on (item, group) group_left (sink) "
        "max(b{c=~'d|e'}[1h:30s]) > bool 1e3 and c unless time() - d @ start() or vector(0)"
    ) == {"a_total", "b", "c", "d"}
    assert metric_names('sum(x) by (kind) > 0 or {__name__="y", job="z"}') == {"x", "y"}
    assert metric_names("label_values(seckill_stream_length, item)") == {"seckill_stream_length"}
    assert metric_names("max(m) > -Inf + NaN * 0x1F") == {"m"}


def test_exposed_names_follow_prometheus_client() -> None:
    names = exposed_names()
    assert {
        "seckill_http_requests_total",
        "seckill_http_request_duration_seconds_bucket",
        "seckill_http_request_duration_seconds_count",
        "seckill_queue_admissions_total",  # defined without the suffix: the client adds it
        "seckill_dependency_up",
        "seckill_refunds_owed",
    } <= names
    assert not {"seckill_http_requests", "seckill_http_request_duration_seconds"} & names


# -- The checks, each over a tree (the repository, or a copy with a mistake) ---------------------


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail(
            "promtool is not installed: `scripts/system-deps` installs it (Debian's prometheus "
            "package), or `apt-get install prometheus`"
        )
    return found


def run_promtool(root: Path, *args: str) -> list[str]:
    """``promtool ARGS`` in ``root``: [] when it passes, else what it printed."""
    done = subprocess.run(
        [promtool(), *args], cwd=root, capture_output=True, text=True, timeout=120, check=False
    )
    return (
        [] if done.returncode == 0 else [f"promtool {' '.join(args)}:\n{done.stdout}{done.stderr}"]
    )


def rule_tests(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / RULES_DIR).glob("*_test.yaml"))


def rules(root: Path) -> Iterator[dict[str, Any]]:
    for group in yaml.safe_load((root / ALERTS).read_text())["groups"]:
        yield from group["rules"]


def alerts(root: Path) -> Iterator[dict[str, Any]]:
    return (rule for rule in rules(root) if "alert" in rule)


def recorded(root: Path) -> frozenset[str]:
    return frozenset(rule["record"] for rule in rules(root) if "record" in rule)


def dashboard_queries(root: Path) -> Iterator[tuple[str, str]]:
    """(where, query) for every panel's target and every query variable."""
    board = json.loads((root / DASHBOARD).read_text())

    def panels(within: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in within:
            yield panel
            yield from panels(panel.get("panels", []))

    for panel in panels(board["panels"]):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            yield (
                f"variable {variable['name']}",
                query.get("query", "") if isinstance(query, dict) else query,
            )


def check_rules(root: Path) -> list[str]:
    return run_promtool(root, "check", "rules", str(ALERTS))


def check_rule_tests(root: Path) -> list[str]:
    tests = rule_tests(root)
    if not tests:
        return [f"no unit tests of the rules: {RULES_DIR}/*_test.yaml"]
    return run_promtool(root, "test", "rules", *tests)


def unknown_metrics_in_alerts(root: Path) -> list[str]:
    known = exposed_names() | recorded(root) | OTHER_METRICS
    return [
        f"{'alert' if 'alert' in rule else 'record'} {rule.get('alert') or rule['record']}: "
        f"{name} is not a metric seckill exposes"
        for rule in rules(root)
        for name in sorted(metric_names(rule["expr"]) - known)
    ]


_AGGREGATION = re.compile(
    r"\b(sum|max|min|avg|count|topk|bottomk|quantile|stddev|stdvar|group)\s*"
    r"(?:(by|without)\s*\(([^()]*)\))?\s*\("
)


def aggregated_across_namespaces(root: Path) -> list[str]:
    """Each aggregation in a rule keeps the namespace (``by (namespace, ...)``): one written
    without it (``max(x)``) merges two deployments, and one's dead reaper hides behind the
    other's."""
    problems = []
    for rule in rules(root):
        name = rule.get("alert") or rule["record"]
        for match in _AGGREGATION.finditer(_STRING.sub('""', rule["expr"])):
            how, labels = match.group(2), match.group(3) or ""
            kept = {label.strip() for label in labels.split(",")}
            if (
                (how == "by" and "namespace" not in kept)
                or (how == "without" and "namespace" in kept)
                or how is None
            ):
                problems.append(f"{name}: {match.group().strip()} does not keep the namespace")
    return problems


def prometheus_rule_drift(root: Path) -> list[str]:
    """The PrometheusRule in deploy/k8s/base is what the generator writes from alerts.yaml."""
    namespace: dict[str, Any] = {"__name__": "prometheusrule", "__file__": str(root / GENERATOR)}
    exec(compile((root / GENERATOR).read_text(), str(GENERATOR), "exec"), namespace)
    expected = namespace["text"](root / ALERTS)
    shipped = (root / PROMETHEUS_RULE).read_text()
    if yaml.safe_load(shipped)["spec"] != yaml.safe_load(expected)["spec"] or shipped != expected:
        return [f"{PROMETHEUS_RULE} differs from {ALERTS}: run `python {GENERATOR}`"]
    return []


def unknown_metrics_in_dashboard(root: Path) -> list[str]:
    known = exposed_names()
    return [
        f"{where}: {name} is not a metric seckill exposes"
        for where, query in dashboard_queries(root)
        for name in sorted(metric_names(query) - known)
    ]


def dashboard_queries_parse(root: Path, tmp: Path) -> list[str]:
    """Every dashboard query, its Grafana variables given values, parsed by promtool (as
    recording rules: ``check rules`` parses each expression)."""
    rules = [
        {"record": f"dashboard:query_{i}", "expr": _GRAFANA_VARIABLE.sub(_example, query)}
        for i, (_, query) in enumerate(dashboard_queries(root))
        if not query.startswith("label_values(")
    ]
    path = tmp / "dashboard_queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    return run_promtool(tmp, "check", "rules", path.name)


def _example(variable: re.Match[str]) -> str:
    return ".*" if variable.group().strip("${}") == "item" else "5m"


def dashboard_datasources(root: Path) -> list[str]:
    """The dashboard queries the `${datasource}` variable (a Prometheus data source), never a
    data source fixed by uid."""
    board = json.loads((root / DASHBOARD).read_text())
    problems = []
    variables = {v["name"]: v for v in board["templating"]["list"]}
    chosen = variables.get("datasource", {})
    if (chosen.get("type"), chosen.get("query")) != ("datasource", "prometheus"):
        problems.append("no `datasource` variable of type datasource over prometheus")
    if not 36 <= board.get("schemaVersion", 0) <= 41:
        problems.append(f"schemaVersion {board.get('schemaVersion')} is not Grafana 10's or 11's")

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            source = node.get("datasource")
            built_in = isinstance(source, dict) and source.get("type") == "grafana"
            if source is not None and not built_in and source != VARIABLE_SOURCE:
                problems.append(f"{where}: datasource {source} is not ${{datasource}}")
            for key, value in node.items():
                walk(value, f"{where}/{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}[{i}]")

    walk(board, "")
    return problems


def slug(heading: str) -> str:
    """The anchor GitHub (and most Markdown renderers) give a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def missing_runbook_anchors(root: Path) -> list[str]:
    text = (root / RUNBOOK).read_text()
    anchors = {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.MULTILINE)}
    problems = []
    for rule in alerts(root):
        url = rule.get("annotations", {}).get("runbook_url", "")
        path, _, anchor = url.partition("#")
        if path != str(RUNBOOK) or anchor not in anchors:
            problems.append(
                f"alert {rule['alert']}: runbook_url {url!r} is no section of {RUNBOOK}"
            )
    return problems


def incomplete_alerts(root: Path) -> list[str]:
    problems = []
    for rule in alerts(root):
        name = rule["alert"]
        if not rule.get("for"):
            problems.append(f"alert {name}: no `for:`")
        if rule.get("labels", {}).get("severity") not in SEVERITIES:
            problems.append(f"alert {name}: severity is not one of {sorted(SEVERITIES)}")
        for key in ("summary", "description", "runbook_url"):
            if not rule.get("annotations", {}).get(key):
                problems.append(f"alert {name}: no {key} annotation")
    return problems


def untested_alerts(root: Path) -> list[str]:
    """Each alert must be expected to fire in some unit test, and expected quiet in another."""
    fired: set[str] = set()
    quiet: set[str] = set()
    for test_file in rule_tests(root):
        for case in yaml.safe_load((root / test_file).read_text()).get("tests", []):
            for check in case.get("alert_rule_test", []):
                (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    problems = []
    for rule in alerts(root):
        name = rule["alert"]
        if name not in fired:
            problems.append(f"alert {name}: no unit test expects it to fire")
        if name not in quiet:
            problems.append(f"alert {name}: no unit test expects it to stay quiet")
    return problems


CHECKS: dict[str, Callable[[Path, Path], list[str]]] = {
    "promtool check rules": lambda root, _: check_rules(root),
    "promtool test rules": lambda root, _: check_rule_tests(root),
    "alert metrics": lambda root, _: unknown_metrics_in_alerts(root),
    "dashboard metrics": lambda root, _: unknown_metrics_in_dashboard(root),
    "dashboard queries parse": dashboard_queries_parse,
    "dashboard datasource": lambda root, _: dashboard_datasources(root),
    "runbook anchors": lambda root, _: missing_runbook_anchors(root),
    "alert fields": lambda root, _: incomplete_alerts(root),
    "alerts tested": lambda root, _: untested_alerts(root),
    "aggregated by namespace": lambda root, _: aggregated_across_namespaces(root),
    "PrometheusRule matches": lambda root, _: prometheus_rule_drift(root),
}


@pytest.mark.parametrize("check", CHECKS)
def test_the_assets_pass(check: str, tmp_path: Path) -> None:
    assert CHECKS[check](REPO, tmp_path) == []


def test_the_assets_cover_what_operators_watch() -> None:
    alerted = {name for rule in rules(REPO) for name in metric_names(rule["expr"])}
    shown = {name for _, query in dashboard_queries(REPO) for name in metric_names(query)}
    watched = {
        "seckill_reaper_last_pass_timestamp_seconds",
        "seckill_reconciler_last_pass_timestamp_seconds",
        "seckill_reconciler_drift",
        "seckill_dead_letters_total",
        "seckill_sql_transactions_total",
        "seckill_shed_total",
        "seckill_refunds_owed",
        "seckill_dependency_up",
    }
    # Alerts on age and state: the oldest entry waiting, fenced and failed answers, targets.
    paged_on = {
        "seckill_stream_oldest_age_seconds",
        "seckill_http_requests_total",
        "up",
        "redis_memory_used_bytes",
    }
    assert watched | paged_on <= alerted, (watched | paged_on) - alerted
    assert {"seckill_stream_lag", "seckill_stream_pending"}.isdisjoint(alerted), "size, not age"
    assert (
        watched
        | {"seckill_stream_lag", "seckill_stream_pending"}
        | {"seckill_http_requests_total", "seckill_http_request_duration_seconds_bucket"}
        <= shown
    )


# -- Each check fails on a copy with one mistake ----------------------------------------------


def _replace(path: Path, old: str, new: str, count: int = 1) -> Callable[[Path], None]:
    def plant(root: Path) -> None:
        file = root / path
        text = file.read_text()
        assert old in text, f"{old!r} is not in {path}: the planted mistake needs updating"
        file.write_text(text.replace(old, new, count))

    return plant


def _panel_source(uid: str) -> Callable[[Path], None]:
    def plant(root: Path) -> None:
        file = root / DASHBOARD
        board = json.loads(file.read_text())
        board["panels"][1]["targets"][0]["datasource"] = {"type": "prometheus", "uid": uid}
        file.write_text(json.dumps(board))

    return plant


# (what is wrong, the check that must catch it, the planting, what the report must name)
MISTAKES = [
    ("an alert reads a metric the code lacks", "alert metrics",
     _replace(ALERTS, "(seckill_refunds_owed)", "(seckill_refunds_pending)"),
     "seckill_refunds_pending"),
    ("an alert reads a counter without _total", "alert metrics",
     _replace(ALERTS, "increase(seckill_dead_letters_total[", "increase(seckill_dead_letters["),
     "seckill_dead_letters "),
    ("a panel reads a metric the code lacks", "dashboard metrics",
     _replace(DASHBOARD, "seckill_stream_pending{", "seckill_stream_pendings{"),
     "seckill_stream_pendings"),
    ("a panel reads a histogram without _bucket", "dashboard metrics",
     _replace(DASHBOARD, "seckill_http_request_duration_seconds_bucket",
              "seckill_http_request_duration_bucket"),
     "seckill_http_request_duration_bucket"),
    ("a panel query does not parse", "dashboard queries parse",
     _replace(DASHBOARD, "sum(rate(seckill_shed_total[$__rate_interval]))",
              "sum(rate(seckill_shed_total[$__rate_interval])"),
     "dashboard_queries.yaml"),
    ("a panel fixes its data source", "dashboard datasource",
     _panel_source("P1809F7CD0C75ACF3"), "/panels[1]/targets[0]: datasource"),
    ("a variable fixes its data source", "dashboard datasource",
     _replace(DASHBOARD, '"uid": "${datasource}"', '"uid": "P1809F7CD0C75ACF3"'),
     "/templating/list[1]"),
    ("an alert does not parse", "promtool check rules",
     _replace(ALERTS, "(seckill_refunds_owed) > 0", "(seckill_refunds_owed > 0"),
     "alerts.yaml"),
    ("a unit test expects the wrong thing", "promtool test rules",
     _replace(RULES_DIR / "alerts_test.yaml", "2 refunds owed", "3 refunds owed"),
     "SeckillRefundsOwed"),
    ("an alert's threshold moves under its test", "promtool test rules",
     _replace(ALERTS, "(seckill_reaper_last_pass_timestamp_seconds) > 60",
              "(seckill_reaper_last_pass_timestamp_seconds) > 600"),
     "SeckillReaperStale"),
    ("a runbook anchor that does not exist", "runbook anchors",
     _replace(ALERTS, "docs/runbook.md#refunds-are-owed", "docs/runbook.md#refunds-owed"),
     "SeckillRefundsOwed"),
    ("a runbook section renamed under its alerts", "runbook anchors",
     _replace(RUNBOOK, "## Dead letters\n", "## Dead entries\n"),
     "SeckillDeadLetters"),
    ("an alert with no for:", "alert fields",
     _replace(ALERTS, "        for: 1h\n", ""),
     "SeckillRefundsOwed: no `for:`"),
    ("an alert with an unknown severity", "alert fields",
     _replace(ALERTS, "severity: warning", "severity: page-someone"),
     "severity"),
    ("an alert no unit test fires", "alerts tested",
     _replace(ALERTS, "  - name: seckill-sales\n    rules:\n",
              "  - name: seckill-sales\n    rules:\n      - alert: SeckillUntested\n"
              "        expr: max(seckill_refunds_owed) > 100\n        for: 1m\n"),
     "SeckillUntested: no unit test expects it to fire"),
    ("a recording rule reads a metric the code lacks", "alert metrics",
     _replace(ALERTS, "(rate(seckill_http_requests_total[5m]))",
              "(rate(seckill_http_request_total[5m]))"),
     "record seckill:http_errors:ratio_rate5m: seckill_http_request_total"),
    ("an alert aggregates across deployments", "aggregated by namespace",
     _replace(ALERTS, "max by (namespace) (seckill_reaper_last_pass_timestamp_seconds)",
              "max(seckill_reaper_last_pass_timestamp_seconds)"),
     "SeckillReaperStale: max( does not keep the namespace"),
    ("an alert groups by instance only", "aggregated by namespace",
     _replace(ALERTS, "sum by (namespace) (increase(seckill_dead_letters_total",
              "sum by (instance) (increase(seckill_dead_letters_total"),
     "SeckillDeadLetters"),
    ("an alert changed in alerts.yaml alone", "PrometheusRule matches",
     _replace(ALERTS, "> 300\n        for: 2m", "> 600\n        for: 2m"),
     "run `python deploy/prometheus/prometheusrule.py`"),
    ("the PrometheusRule edited by hand", "PrometheusRule matches",
     _replace(PROMETHEUS_RULE, "for: 1h", "for: 2h"),
     "differs"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("check", "plant", "named"),
    [pytest.param(check, plant, named, id=what) for what, check, plant, named in MISTAKES],
)
def test_a_planted_mistake_is_caught(
    check: str, plant: Callable[[Path], None], named: str, tmp_path: Path
) -> None:
    root = tmp_path / "copy"
    for path in (RULES_DIR, DASHBOARD.parent):
        shutil.copytree(REPO / path, root / path)
    (root / PROMETHEUS_RULE).parent.mkdir(parents=True)
    shutil.copy(REPO / PROMETHEUS_RULE, root / PROMETHEUS_RULE)
    (root / RUNBOOK).parent.mkdir(parents=True)
    shutil.copy(REPO / RUNBOOK, root / RUNBOOK)
    if check == "promtool test rules":  # the unit tests of the alert planted on only: faster
        tests = root / RULES_DIR / "alerts_test.yaml"
        suite = yaml.safe_load(tests.read_text())
        suite["tests"] = [case for case in suite["tests"] if named in yaml.safe_dump(case)]
        assert suite["tests"], f"no unit test of {named}"
        tests.write_text(yaml.safe_dump(suite, sort_keys=False))
    assert CHECKS[check](root, tmp_path) == [], "the copy passes before the mistake"
    plant(root)
    problems = CHECKS[check](root, tmp_path)
    assert problems, f"{check} did not catch it"
    assert named in "\n".join(problems), problems


def test_without_promtool_the_failure_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match="scripts/system-deps"):
        check_rules(REPO)
