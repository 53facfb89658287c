"""Write deploy/k8s/base/prometheusrule.yaml from deploy/prometheus/alerts.yaml, the one source
of seckill's rules: the same groups, as the Prometheus Operator's PrometheusRule.

    python deploy/prometheus/prometheusrule.py

tests/deploy/test_observability_assets.py fails while the two differ.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "alerts.yaml"
TARGET = HERE.parent / "k8s" / "base" / "prometheusrule.yaml"
HEADER = """\
# Written by `python deploy/prometheus/prometheusrule.py` from deploy/prometheus/alerts.yaml,
# the one source of the rules: edit that file, then run the script. Its `release` label, which
# kube-prometheus-stack's ruleSelector matches, is set with the ServiceMonitors' in
# kustomization.yaml.
"""


def prometheus_rule(source: Path = SOURCE) -> dict[str, Any]:
    """The PrometheusRule holding every group of ``source``."""
    groups = yaml.safe_load(source.read_text())["groups"]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "seckill",
            "labels": {"app.kubernetes.io/name": "seckill"},
        },
        "spec": {"groups": groups},
    }


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the expressions) as literal blocks, as in the source."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _string)


def text(source: Path = SOURCE) -> str:
    body = yaml.dump(prometheus_rule(source), Dumper=_Dumper, sort_keys=False, width=100)
    return HEADER + body


if __name__ == "__main__":
    TARGET.write_text(text())
    sys.stdout.write(f"wrote {TARGET}\n")
