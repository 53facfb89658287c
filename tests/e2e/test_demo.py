"""The README's main job and the bench, at a small size, through the real command line: a
server on embedded defaults, a crowd over HTTP (through a waiting room too), the verdict, and
the reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from seckill.demo import serving
from tests.support.report_page import body_rows, cells, numbers, parse, texts

VERDICTS = (
    "not oversold",
    "buyers within limit",
    "no lost orders",
    "no duplicate orders",
    "payments counted once",
    "every charge accounted for",
    "released units resold or on sale",
    "Redis == SQL",
    "server audit",
)
QUEUE_VERDICTS = (
    "admitted in position order",
    "pre-start joiners in random order",
    "positions unique and contiguous",
    "nobody left waiting",
    "sold out reached everyone",
)


def run(*args: str, data_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SECKILL_")}
    if data_dir is not None:
        env["SECKILL_DATA_DIR"] = str(data_dir)
    return subprocess.run(
        [sys.executable, "-m", "seckill.cli", *args],
        capture_output=True, text=True, env={**env, "COLUMNS": "200"}, timeout=300,
    )  # fmt: skip


def reports(directory: Path) -> tuple[dict[str, Any], str]:
    (json_path,) = directory.glob("*.json")
    (html_path,) = directory.glob("*.html")
    return json.loads(json_path.read_text()), html_path.read_text()


def assert_page_shows(result: dict[str, Any], page: str) -> None:
    """The HTML report embeds the JSON result exactly, and its tables show the same figures."""
    parsed = parse(page)
    assert parsed.result_text is not None
    assert json.loads(parsed.result_text) == result
    rows = body_rows(parsed, "outcomes")
    shown = {(texts(r)["action"], texts(r)["outcome"]): numbers(r) for r in rows}
    for row in result["outcomes"]:
        figures = shown[row["action"], row["outcome"]]
        assert figures["count"] == row["count"] and figures["p99_ms"] == row["p99_ms"]
    assert len(body_rows(parsed, "verdicts")) == len(result["verdicts"])


def test_the_demo_passes_its_verdicts_on_embedded_defaults(tmp_path: Path) -> None:
    done = run("demo", "--buyers", "500", "--units", "20", "--report-dir", str(tmp_path))

    assert done.returncode == 0, done.stdout + done.stderr
    assert "All checks pass." in done.stdout
    for verdict in VERDICTS:
        assert verdict in done.stdout
    assert "FAIL" not in done.stdout
    result, page = reports(tmp_path)
    assert result["kind"] == "demo" and result["passed"]
    assert [v["name"] for v in result["verdicts"]] == list(VERDICTS)
    assert result["plan"]["buyers"] == 500 and result["plan"]["units"] == 20
    assert result["stock"]["sold"][-1] > 0
    assert_page_shows(result, page)
    # Its last act: the sale ended and the item archived on the console, a screenshot kept.
    assert f"Sale ended and item {result['item_id']} archived on the console" in done.stdout
    (screenshot,) = tmp_path.glob("*-console.png")
    assert screenshot.read_bytes().startswith(b"\x89PNG")


def test_the_demo_runs_on_a_local_redis_cluster(tmp_path: Path) -> None:
    done = run(
        "demo", "--redis-cluster", "3", "--buyers", "300", "--units", "10",
        "--report-dir", str(tmp_path),
    )  # fmt: skip

    assert done.returncode == 0, done.stdout + done.stderr
    assert "Redis Cluster up: 3 masters" in done.stdout
    assert "All checks pass." in done.stdout and "FAIL" not in done.stdout
    result, _ = reports(tmp_path)
    assert result["passed"] and [v["name"] for v in result["verdicts"]] == list(VERDICTS)


def test_bench_rehearses_a_sale_on_a_running_deployment(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with serving(data) as url:
        done = run(
            "bench", "--url", url, "--buyers", "150", "--units", "10", "--concurrency", "16",
            "--pay", "0.6", "--cancel", "0.3", "--fail", "0.1",
            "--database-url", f"sqlite+aiosqlite:///{data / 'seckill.db'}",
            "--report-dir", str(tmp_path / "reports"),
            data_dir=data,  # the deployment's keys: its generated secrets
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    result, page = reports(tmp_path / "reports")
    assert result["kind"] == "bench" and result["target"] == url and result["passed"]
    no_lost = next(v for v in result["verdicts"] if v["name"] == "no lost orders")
    assert "in the API and SQL" in no_lost["detail"]
    assert_page_shows(result, page)


def test_bench_refuses_bad_options_and_an_unreachable_url(tmp_path: Path) -> None:
    shares = run("bench", "--url", "http://127.0.0.1:9", "--pay", "0.8", "--cancel", "0.5")
    assert shares.returncode == 2
    assert "pay + fail + cancel must be at most 1" in shares.stdout

    nobody = run("bench", "--url", "http://127.0.0.1:9", "--buyers", "5", data_dir=tmp_path)
    assert nobody.returncode == 2
    assert "error:" in nobody.stdout and "127.0.0.1:9" in nobody.stdout


def test_the_demo_through_a_waiting_room_passes_its_queue_verdicts(tmp_path: Path) -> None:
    done = run(
        "demo", "--waiting-room", "--buyers", "300", "--units", "10",
        "--report-dir", str(tmp_path),
    )  # fmt: skip

    assert done.returncode == 0, done.stdout + done.stderr
    assert "through a waiting room" in done.stdout
    assert "All checks pass." in done.stdout and "FAIL" not in done.stdout
    for verdict in QUEUE_VERDICTS:
        assert verdict in done.stdout
    assert "Waiting room: 375 joined (300 before the start), positions 1..375" in done.stdout
    result, page = reports(tmp_path)
    assert result["passed"]
    assert [v["name"] for v in result["verdicts"]] == [*VERDICTS, *QUEUE_VERDICTS]
    room = result["waiting_room"]
    assert room["joined"] == room["length"] == 375 and room["drawn"] == 300
    assert room["left_waiting"] == 0 and room["tickets_before_turn"] == 0
    assert room["sold_out_propagation_s"] is not None
    assert room["sold_out_propagation_s"] <= room["propagation_bound_s"]
    assert result["stock"]["sold"][-1] == 10  # the queue sold every unit
    assert_page_shows(result, page)
    shown = numbers(cells(parse(page), "waiting-room"))
    assert shown["joined"] == 375 and shown["rank_correlation"] == room["rank_correlation"]


def test_two_items_one_with_a_waiting_room_both_pass_the_demos_verdicts(tmp_path: Path) -> None:
    done = run(
        "demo", "--waiting-room", "--direct-item", "--buyers", "60", "--units", "4",
        "--report-dir", str(tmp_path),
    )  # fmt: skip

    assert done.returncode == 0, done.stdout + done.stderr
    assert "The item without a waiting room, sold meanwhile:" in done.stdout
    assert done.stdout.count("All checks pass.") == 2 and "FAIL" not in done.stdout
    results = [json.loads(path.read_text()) for path in tmp_path.glob("*.json")]
    assert len(results) == 2 and all(result["passed"] for result in results)
    roomed, direct = sorted(results, key=lambda result: "waiting_room" not in result)
    assert [v["name"] for v in roomed["verdicts"]] == [*VERDICTS, *QUEUE_VERDICTS]
    assert [v["name"] for v in direct["verdicts"]] == list(VERDICTS)
    assert roomed["item_id"] != direct["item_id"]
    assert roomed["waiting_room"]["tickets_before_turn"] == 0
    assert roomed["stock"]["sold"][-1] == direct["stock"]["sold"][-1] == 4
    both = f"{roomed['item_id']}, {direct['item_id']}"
    assert f"Sale ended and item {both} archived on the console" in done.stdout
