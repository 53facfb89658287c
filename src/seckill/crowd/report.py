"""The crowd run's reports: ``<name>.json`` for tools, ``<name>.html`` for people.

The HTML page is one file that needs no network: uPlot (vendored in ``seckill/static/vendor``)
and the result itself are inlined. Every figure and table is rendered here, so the page reads
without JavaScript; the inline script only draws the charts from the embedded result (three,
and a fourth for a run through a waiting room).
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from string import Template

from seckill.crowd.result import CrowdResult, WaitingRoomOut
from seckill.pages import static_text, uplot_fields

# A share of the crowd's buyers, shown as a percentage.
_PLAN_SHARES = frozenset({"pay", "fail", "cancel", "replay"})


@cache
def _page() -> Template:
    """The page, ``static/report.html``: a ``string.Template`` whose chart script,
    ``static/report.js``, reads the embedded result and draws the charts."""
    return Template(static_text("report.html"))


def write_reports(result: CrowdResult, directory: Path, name: str) -> tuple[Path, Path]:
    """Write ``<directory>/<name>.json`` and ``<directory>/<name>.html``; return both paths."""
    directory.mkdir(parents=True, exist_ok=True)
    json_path = directory / f"{name}.json"
    html_path = directory / f"{name}.html"
    json_path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    html_path.write_text(render_html(result), encoding="utf-8")
    return json_path, html_path


def render_html(result: CrowdResult) -> str:
    """The self-contained HTML report of one crowd run."""
    verdict = "PASSED" if result["passed"] else "FAILED"
    return _page().substitute(
        title=_text(f"seckill {result['kind']} — {verdict}"),
        **uplot_fields(),
        header=_header(result),
        summary=_summary(result),
        verdicts=_verdicts(result),
        outcomes=_outcomes(result),
        plan=_plan(result),
        waiting_room=_waiting_room(result["waiting_room"]) if "waiting_room" in result else "",
        footer=_text(f"{result['schema']} · written by seckill {result['seckill_version']}"),
        result_json=_embedded_json(result),
        charts_js=static_text("report.js"),
    )


def _embedded_json(result: CrowdResult) -> str:
    """The result as JSON that is safe inside a ``<script>`` element.

    Every ``<``, ``>`` and ``&`` becomes a ``\\u`` escape, so no string in the result can end the
    element (``</script>``) or switch the parser's script state (``<!--``); ``json.loads`` of the
    element's text gives the result back unchanged.
    """
    text = json.dumps(result, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _text(value: object) -> str:
    return html.escape(str(value))


def _number(field: str, value: object, *, percent: bool = False, digits: int = 2) -> str:
    """A numeric cell: the figure for people, the exact JSON number in ``data-value``."""
    if value is None:
        shown = "—"
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{field} is not a number: {value!r}")
    elif percent:
        shown = f"{value * 100:g}%"
    elif isinstance(value, int):
        shown = f"{value:,}"
    else:
        shown = f"{value:,.{digits}f}"
    return (
        f'<td class="num" data-field="{_text(field)}" data-value="{_text(json.dumps(value))}">'
        f"{shown}</td>"
    )


def _table(table_id: str, head: list[str] | None, rows: list[str]) -> str:
    thead = ""
    if head is not None:
        thead = (
            "<thead><tr>"
            + "".join(f'<th scope="col">{_text(h)}</th>' for h in head)
            + "</tr></thead>"
        )
    body = "\n".join(rows)
    return (
        f'<div class="scroll"><table id="{table_id}">{thead}<tbody>\n{body}\n</tbody></table></div>'
    )


def _header(result: CrowdResult) -> str:
    ok = result["passed"]
    status = f'<span class="{"pass" if ok else "fail"}">{"PASSED" if ok else "FAILED"}</span>'
    facts = [
        ("run", result["kind"]),
        ("target", result["target"]),
        ("item", result["item_id"]),
        ("started at", result["started_at"]),
        ("seckill", result["seckill_version"]),
    ]
    items = "\n".join(f"<dt>{_text(k)}</dt><dd>{_text(v)}</dd>" for k, v in facts)
    return (
        f'<h1 id="status">seckill {_text(result["kind"])}: {status}</h1>\n'
        f'<dl class="meta">\n{items}\n</dl>'
    )


def _summary(result: CrowdResult) -> str:
    figures: list[tuple[str, str, object]] = [
        ("requests", "requests", result["requests"]),
        ("throughput_rps", "throughput (requests/s)", result["throughput_rps"]),
        ("buyers", "buyers", result["buyers"]),
        ("buyers_per_s", "buyers through the sale per second", result["buyers_per_s"]),
        ("crowd_s", "crowd wall time (s)", result["crowd_s"]),
        ("elapsed_s", "elapsed, to the end of the audit (s)", result["elapsed_s"]),
        ("transport_errors", "transport errors (no HTTP answer)", result["transport_errors"]),
    ]
    rows = [
        f'<tr><th scope="row">{_text(label)}</th>{_number(field, value)}</tr>'
        for field, label, value in figures
    ]
    return _table("summary", None, rows)


def _outcomes(result: CrowdResult) -> str:
    head = ["action", "outcome", "count", "req/s", "p50 ms", "p95 ms", "p99 ms"]
    rows = [
        "<tr>"
        f'<td data-field="action">{_text(row["action"])}</td>'
        f'<td data-field="outcome">{_text(row["outcome"])}</td>'
        + _number("count", row["count"])
        + _number("rps", row["rps"])
        + _number("p50_ms", row["p50_ms"])
        + _number("p95_ms", row["p95_ms"])
        + _number("p99_ms", row["p99_ms"])
        + "</tr>"
        for row in result["outcomes"]
    ]
    return _table("outcomes", head, rows)


def _verdicts(result: CrowdResult) -> str:
    rows = []
    for verdict in result["verdicts"]:
        mark = "pass" if verdict["ok"] else "fail"
        rows.append(
            f'<tr class="{mark}">'
            f'<td data-field="name">{_text(verdict["name"])}</td>'
            f'<td data-field="ok" class="{mark}">{"pass" if verdict["ok"] else "FAIL"}</td>'
            f'<td data-field="detail" class="detail">{_text(verdict["detail"])}</td>'
            "</tr>"
        )
    return _table("verdicts", ["check", "result", "detail"], rows)


def _plan(result: CrowdResult) -> str:
    rows = [
        f'<tr><th scope="row">{_text(field)}</th>'
        f"{_number(field, value, percent=field in _PLAN_SHARES)}</tr>"
        for field, value in result["plan"].items()
    ]
    return _table("plan", None, rows)


# The waiting room's figures, in the order the page shows them; the rest of the result's
# waiting room is the chart's data and the last states (a row of their own).
_QUEUE_FIGURES = (
    ("start_s", "the sale's start (s since the first request)"),
    ("joined", "buyers who joined"),
    ("joined_before_start", "joined before the start (placed by the draw)"),
    ("length", "positions given (the server's count)"),
    ("admitted_up_to", "admitted up to"),
    ("out_of_order", "positions let in out of order"),
    ("tickets_before_turn", "tickets asked for before the buyer's turn"),
    ("clock_tolerance_s", "clock tolerance (s)"),
    ("drawn", "pre-start joiners judged"),
    ("rank_correlation", "arrival vs drawn position (Spearman's rho)"),
    ("unrelated_bound", "unrelated orders stay below |rho|"),
    ("positions_held_twice", "positions held twice"),
    ("positions_missing", "positions held by nobody"),
    ("buyers_told_two_positions", "buyers told two positions"),
    ("joined_twice", "buyers who joined twice"),
    ("left_waiting", "buyers still waiting at the end"),
    ("sold_out_propagation_s", "sold out: first reader to last waiting reader (s)"),
    ("poll_gap_s", "longest gap between a waiting buyer's answers (s)"),
    ("propagation_bound_s", "bound on that spread (s)"),
)
_THREE_DIGITS = frozenset({"rank_correlation", "unrelated_bound"})


def _waiting_room(room: WaitingRoomOut) -> str:
    figures: Mapping[str, object] = room
    rows = [
        f'<tr><th scope="row">{_text(label)}</th>'
        f"{_number(field, figures[field], digits=3 if field in _THREE_DIGITS else 2)}</tr>"
        for field, label in _QUEUE_FIGURES
    ]
    states = ", ".join(f"{state} {n:,}" for state, n in room["last_states"].items())
    rows.append(
        '<tr><th scope="row">last states</th>'
        f'<td data-field="last_states">{_text(states)}</td></tr>'
    )
    return (
        "<h2>Waiting room</h2>\n"
        + _table("waiting-room", None, rows)
        + '\n<h2>Positions let in, and tickets</h2>\n<div class="chart" id="chart-queue"></div>'
    )
