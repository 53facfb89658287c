"""The crowd run's reports: the JSON file is the result, and the HTML page shows exactly it.

The page is read back with the standard library's HTML parser, so every check is on what a
browser would see: the embedded result, each table cell's text and exact number, and every
resource the page could load. One more test opens the page in headless Chromium with the
network cut off and checks that uPlot drew the three charts (four through a waiting room).
"""

from __future__ import annotations

import json
import re
import subprocess
from importlib.resources import files
from pathlib import Path

import pytest

from seckill.crowd.report import render_html, write_reports
from seckill.crowd.result import SCHEMA, CrowdResult, VerdictOut, WaitingRoomOut
from tests.support.chromium import CHROMIUM_ARGS, chromium_path
from tests.support.report_page import body_rows, cells, numbers, parse, texts

EVIL_DETAIL = 'sold 101 of 100 units </script><b>not bold</b> & "quoted" <!-- <script>'
VENDOR = files("seckill") / "static" / "vendor"


def crowd_result(*, passed: bool) -> CrowdResult:
    """A bench run's result as the crowd writes it: 100 units, 5,200 buyers."""
    verdicts: list[VerdictOut] = [
        {"name": "stock_conserved", "ok": True, "detail": "available 0 + held 0 + sold 100 = 100"},
        {
            "name": "no_oversell",
            "ok": passed,
            "detail": "sold 100 of 100" if passed else EVIL_DETAIL,
        },
        {"name": "orders_landed", "ok": True, "detail": "100 of 100 reserved orders in SQL"},
    ]
    return {
        "schema": SCHEMA,
        "kind": "bench",
        "seckill_version": "0.1.0",
        "target": "http://127.0.0.1:8000",
        "started_at": "2025-06-18T09:30:00.125000+00:00",
        "plan": {
            "buyers": 5000,
            "late_buyers": 200,
            "concurrency": 200,
            "duration_s": None,
            "units": 100,
            "per_buyer_limit": 1,
            "hold_seconds": 30,
            "pay": 0.6,
            "fail": 0.1,
            "cancel": 0.1,
            "replay": 0.05,
            "seed": 20250618,
        },
        "item_id": 42,
        "crowd_s": 3.4170981,
        "elapsed_s": 7.0062315,
        "requests": 10637,
        "transport_errors": 2,
        "throughput_rps": 3112.9041637,
        "buyers": 5200,
        "buyers_per_s": 1521.8,
        "outcomes": [
            {
                "action": "buy",
                "outcome": "reserved",
                "count": 100,
                "rps": 29.264537,
                "p50_ms": 4.1875,
                "p95_ms": 11.02,
                "p99_ms": 17.913333333333334,
            },
            {
                "action": "buy",
                "outcome": "sold_out",
                "count": 5100,
                "rps": 1492.4922,
                "p50_ms": 2.5,
                "p95_ms": 8.75,
                "p99_ms": 1234.5678,
            },
            {
                "action": "pay",
                "outcome": "paid",
                "count": 60,
                "rps": 17.558722,
                "p50_ms": 6.0,
                "p95_ms": 9.3,
                "p99_ms": 12.000000000000002,
            },
        ],
        "timeline": {
            "interval_s": 0.5,
            "t_s": [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0],
            "requests_per_s": [1820.0, 3604.0, 3920.0, 3410.0, 2980.0, 400.0, 26.0],
        },
        "latency_histogram": {
            "edges_ms": [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0],
            "series": [
                {
                    "action": "buy",
                    "outcome": "reserved",
                    "counts": [0, 0, 3, 21, 40, 30, 5, 1, 0, 0],
                },
                {
                    "action": "buy",
                    "outcome": "sold_out",
                    "counts": [0, 12, 400, 2100, 1900, 500, 120, 40, 20, 8],
                },
                {"action": "pay", "outcome": "paid", "counts": [0, 0, 0, 5, 30, 20, 4, 1, 0, 0]},
            ],
        },
        "stock": {
            "t_s": [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5],
            "available": [100, 40, 0, 0, 0, 10, 0, 0],
            "held": [0, 60, 100, 70, 40, 20, 10, 0],
            "sold": [0, 0, 0, 30, 60, 70, 90, 100],
            "backlog": [0, 35, 80, 40, 12, 3, 0, 0],
        },
        "verdicts": verdicts,
        "passed": passed,
    }


@pytest.fixture(params=[False, True], ids=["failed", "passed"])
def written(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[CrowdResult, Path, Path]:
    result = crowd_result(passed=request.param)
    json_path, html_path = write_reports(result, tmp_path / "reports" / "run", "bench-42")
    return result, json_path, html_path


def test_write_reports_writes_the_json_and_the_page(
    written: tuple[CrowdResult, Path, Path], tmp_path: Path
) -> None:
    result, json_path, html_path = written
    assert json_path == tmp_path / "reports" / "run" / "bench-42.json"
    assert html_path == tmp_path / "reports" / "run" / "bench-42.html"
    text = json_path.read_text(encoding="utf-8")
    assert text.endswith("}\n")
    assert text.startswith('{\n  "schema": ')
    assert json.loads(text) == result
    assert html_path.read_text(encoding="utf-8") == render_html(result)


def test_the_page_embeds_the_result_exactly(written: tuple[CrowdResult, Path, Path]) -> None:
    result, json_path, html_path = written
    page = html_path.read_text(encoding="utf-8")
    parsed = parse(page)
    assert parsed.result_text is not None
    assert json.loads(parsed.result_text) == json.loads(json_path.read_text(encoding="utf-8"))
    assert json.loads(parsed.result_text) == result
    # The detail's markup never reaches the parser as markup, in the JSON or in the table.
    assert "</script><b>" not in page
    assert "b" not in parsed.start_tags
    assert parsed.start_tags.count("script") == 3


def test_the_tables_show_every_figure_exactly(written: tuple[CrowdResult, Path, Path]) -> None:
    result, _, html_path = written
    parsed = parse(html_path.read_text(encoding="utf-8"))

    summary_cells = cells(parsed, "summary")
    summary = numbers(summary_cells)
    assert summary == {
        "requests": result["requests"],
        "throughput_rps": result["throughput_rps"],
        "buyers": result["buyers"],
        "buyers_per_s": result["buyers_per_s"],
        "crowd_s": result["crowd_s"],
        "elapsed_s": result["elapsed_s"],
        "transport_errors": result["transport_errors"],
    }
    assert type(summary["requests"]) is int and type(summary["crowd_s"]) is float
    shown = texts(summary_cells)
    assert shown["requests"] == "10,637"
    assert shown["throughput_rps"] == "3,112.90"

    outcomes = body_rows(parsed, "outcomes")
    assert len(outcomes) == len(result["outcomes"])
    for row, expected in zip(outcomes, result["outcomes"], strict=True):
        assert texts(row)["action"] == expected["action"]
        assert texts(row)["outcome"] == expected["outcome"]
        assert numbers(row) == {k: v for k, v in expected.items() if k not in ("action", "outcome")}
    assert [c.text for c in parsed.tables["outcomes"][0]] == [
        "action", "outcome", "count", "req/s", "p50 ms", "p95 ms", "p99 ms",
    ]  # fmt: skip

    plan = numbers(cells(parsed, "plan"))
    assert plan == result["plan"]

    verdicts = body_rows(parsed, "verdicts")
    assert [(t["name"], t["ok"], t["detail"]) for t in map(texts, verdicts)] == [
        (v["name"], "pass" if v["ok"] else "FAIL", v["detail"]) for v in result["verdicts"]
    ]


def test_a_failing_detail_shows_as_text() -> None:
    parsed = parse(render_html(crowd_result(passed=False)))
    details = [texts(row)["detail"] for row in body_rows(parsed, "verdicts")]
    assert EVIL_DETAIL in details


def test_the_header_says_passed_or_failed(written: tuple[CrowdResult, Path, Path]) -> None:
    result, _, html_path = written
    parsed = parse(html_path.read_text(encoding="utf-8"))
    expected, other = ("PASSED", "FAILED") if result["passed"] else ("FAILED", "PASSED")
    assert parsed.status == f"seckill bench: {expected}"
    assert other not in html_path.read_text(encoding="utf-8")


def test_the_page_loads_nothing_from_anywhere(written: tuple[CrowdResult, Path, Path]) -> None:
    _, _, html_path = written
    page = html_path.read_text(encoding="utf-8")
    parsed = parse(page)
    assert not [url for url in parsed.urls if re.match(r"\s*(https?:)?//", url, re.I)]
    assert not [attrs for attrs in parsed.scripts if "src" in attrs]
    assert not {"link", "img", "iframe", "object", "embed"} & set(parsed.start_tags)
    styles = re.findall(r"<style>(.*?)</style>", page, re.S)
    assert styles and not [s for s in styles if "url(" in s or "@import" in s]
    # uPlot itself is inlined, verbatim.
    vendored = (VENDOR / "uPlot.iife.min.js").read_text(encoding="utf-8")
    assert "uPlot" in page
    assert len(page.encode()) > len(vendored.encode())
    assert any(vendored in text for text in parsed.script_texts)


def drawn_offline(html_path: Path, tmp_path: Path) -> str:
    """What the page's scripts made of it in headless Chromium, with no network at all."""
    dom = subprocess.run(
        [
            chromium_path(),
            "--headless",
            *CHROMIUM_ARGS,
            # No name resolves: anything the page tried to fetch would fail.
            "--host-resolver-rules=MAP * ~NOTFOUND",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom",
            html_path.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return re.sub(r"<script\b.*?</script>", "", dom, flags=re.S)


def test_chromium_draws_three_charts_offline(tmp_path: Path) -> None:
    _, html_path = write_reports(crowd_result(passed=False), tmp_path, "demo")
    drawn = drawn_offline(html_path, tmp_path)
    assert len(re.findall(r'<div class="uplot\b', drawn)) == 3
    for chart in ("chart-timeline", "chart-latency", "chart-stock"):
        assert re.search(rf'id="{chart}"><div class="uplot\b.*?<canvas', drawn, re.S), chart
    # Each chart's legend names its series.
    for label in ("requests/s", "buy sold_out", "pay paid", "available", "held", "backlog"):
        assert re.search(rf'class="u-label"[^>]*>{label}<', drawn), label


def waiting_room() -> WaitingRoomOut:
    """A run through a waiting room: 5,200 joined, 5,000 before the start, 240 let in."""
    return {
        "start_s": 3.004,
        "joined": 5200,
        "joined_before_start": 5000,
        "length": 5200,
        "admitted_up_to": 240,
        "out_of_order": 0,
        "tickets_before_turn": 0,
        "clock_tolerance_s": 1.0,
        "drawn": 5000,
        "rank_correlation": -0.0123,
        "unrelated_bound": 0.0566,
        "positions_held_twice": 0,
        "positions_missing": 0,
        "buyers_told_two_positions": 0,
        "joined_twice": 260,
        "left_waiting": 0,
        "last_states": {"admitted": 240, "sold_out": 4960},
        "sold_out_propagation_s": 2.125,
        "poll_gap_s": 2.31,
        "propagation_bound_s": 3.81,
        "admissions": {"t_s": [3.1, 3.6, 4.1, 6.2], "upto": [50, 100, 200, 240]},
        "tickets": {"t_s": [3.31, 3.35, 3.9, 4.4, 6.5], "position": [7, 31, 88, 150, 233]},
    }


def test_a_waiting_room_shows_its_figures_and_nothing_shows_without_one() -> None:
    result = crowd_result(passed=True)
    assert "waiting-room" not in parse(render_html(result)).tables
    assert 'id="chart-queue"' not in render_html(result)

    result["waiting_room"] = room = waiting_room()
    page = render_html(result)
    parsed = parse(page)
    assert json.loads(parsed.result_text or "") == result
    shown = cells(parsed, "waiting-room")
    figures = numbers(shown)
    assert figures == {k: v for k, v in room.items() if not isinstance(v, dict)}
    assert texts(shown)["rank_correlation"] == "-0.012"
    assert texts(shown)["joined"] == "5,200"
    assert texts(shown)["last_states"] == "admitted 240, sold_out 4,960"
    assert 'id="chart-queue"' in page


def test_chromium_draws_the_waiting_room_chart_offline(tmp_path: Path) -> None:
    result = crowd_result(passed=True)
    result["waiting_room"] = waiting_room()
    _, html_path = write_reports(result, tmp_path, "demo")
    drawn = drawn_offline(html_path, tmp_path)
    assert len(re.findall(r'<div class="uplot\b', drawn)) == 4
    assert re.search(r'id="chart-queue"><div class="uplot\b.*?<canvas', drawn, re.S)
    for label in ("admitted up to", "tickets"):
        assert re.search(rf'class="u-label"[^>]*>{label}<', drawn), label
