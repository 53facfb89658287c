"""The demo with the bridge on, through the real command line and a real broker: the server
forwards the sale's order events, a consumer of the broker's default topology gets them all,
and the verdict says so. Run for each broker whose URL is set (``tests/brokers.py``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.test_demo import VERDICTS, reports, run
from tests.support.brokers import BROKER_URLS, TESTED_BROKERS


@pytest.mark.parametrize("broker", TESTED_BROKERS)
def test_the_demo_with_a_bridge_delivers_every_order_event(broker: str, tmp_path: Path) -> None:
    done = run(
        "demo", "--bridge", BROKER_URLS[broker], "--buyers", "200", "--units", "10",
        "--report-dir", str(tmp_path),
    )  # fmt: skip

    assert done.returncode == 0, done.stdout + done.stderr
    assert "order events to a broker" in done.stdout
    assert "All checks pass." in done.stdout and "FAIL" not in done.stdout
    result, _ = reports(tmp_path)
    assert result["passed"]
    assert [v["name"] for v in result["verdicts"]] == [*VERDICTS, "order events delivered"]
    verdicts = {v["name"]: v["detail"] for v in result["verdicts"]}
    answered = re.search(r"(\d+) orders answered 202", verdicts["no lost orders"])
    shown = re.search(
        r"(\d+) events of (\d+) orders delivered \((\d+) copies.*the crowd holds (\d+) orders",
        verdicts["order events delivered"],
    )
    assert answered and shown, verdicts
    events, orders, _, held = map(int, shown.groups())
    # Every order reserved, then paid or released: two events each at least.
    assert orders == held == int(answered.group(1)) > 0 and events >= 2 * orders
    assert "reserved first" in verdicts["order events delivered"]
