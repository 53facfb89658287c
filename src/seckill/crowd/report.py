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
from pathlib import Path
from string import Template

from seckill.crowd.result import CrowdResult, WaitingRoomOut
from seckill.pages import uplot_fields

# A share of the crowd's buyers, shown as a percentage.
_PLAN_SHARES = frozenset({"pay", "fail", "cancel", "replay"})

_PAGE = Template("""\
<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>$title</title>
<style>
$uplot_css
</style>
<style>
body { font: 15px/1.45 system-ui, sans-serif; color: #1f2328; margin: 0 auto;
       max-width: 1100px; padding: 1rem; }
h1 { font-size: 1.5rem; margin: 0 0 .5rem; }
h2 { font-size: 1.15rem; margin: 1.75rem 0 .5rem; }
.pass { color: #1a7f37; }
.fail { color: #cf222e; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: .15rem 1rem; margin: 0; }
dl.meta dt { color: #59636e; }
dl.meta dd { margin: 0; overflow-wrap: anywhere; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; }
th, td { padding: .3rem .65rem; border-bottom: 1px solid #d1d9e0; text-align: left;
         vertical-align: top; }
th { font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.detail { white-space: pre-wrap; overflow-wrap: anywhere; min-width: 16rem; }
.chart { min-height: 2rem; }
footer { margin-top: 2rem; color: #59636e; font-size: .85rem; }
</style>
</head>
<body>
<header>
$header
</header>
<main>
<h2>Summary</h2>
$summary
<h2>Checks</h2>
$verdicts
<h2>Outcomes</h2>
$outcomes
<h2>Requests per second</h2>
<div class="chart" id="chart-timeline"></div>
<h2>Latency by outcome</h2>
<div class="chart" id="chart-latency"></div>
<h2>Stock</h2>
<div class="chart" id="chart-stock"></div>
$waiting_room
<noscript><p>The charts need JavaScript; the tables hold every figure.</p></noscript>
<h2>Plan</h2>
$plan
</main>
<footer>$footer</footer>
<script type="application/json" id="crowd-result">$result_json</script>
<script>
/*
uPlot, vendored:
$uplot_license
*/
$uplot_js
</script>
<script>
$charts_js
</script>
</body>
</html>
""")

# Reads the embedded result and draws the charts. Bins and intervals are drawn as steps: a value
# holds from its x to the next one, so each series gets one closing point.
_CHARTS_JS = """\
(function () {
  "use strict";
  var result = JSON.parse(document.getElementById("crowd-result").textContent);
  var palette = ["#0969da", "#bc4c00", "#8250df", "#1a7f37", "#cf222e", "#6e7781",
                 "#bf8700", "#1b7c83", "#e85aad", "#4d2d00"];
  var height = 260;
  var charts = [];

  function widthOf(el) { return Math.max(260, el.clientWidth); }

  function draw(id, opts, data) {
    var el = document.getElementById(id);
    if (data[0].length === 0) { el.textContent = "No samples."; return; }
    opts.width = widthOf(el);
    opts.height = height;
    charts.push({ el: el, plot: new uPlot(opts, data, el) });
  }

  function steps() { return uPlot.paths.stepped({ align: 1 }); }

  function closed(values) { return values.concat(values.slice(-1)); }

  function ms(v) { return v >= 1000 ? +(v / 1000).toPrecision(3) + " s" : +v.toPrecision(3) + ""; }

  // Requests per second, one step per interval.
  var tl = result.timeline;
  var tEnd = tl.t_s.length ? [tl.t_s[tl.t_s.length - 1] + tl.interval_s] : [];
  draw("chart-timeline", {
    scales: { x: { time: false } },
    axes: [{ label: "seconds since the first request" }, { label: "requests/s" }],
    series: [
      { label: "t (s)" },
      { label: "requests/s", stroke: palette[0], fill: "rgba(9, 105, 218, 0.1)", width: 2,
        paths: steps(), points: { show: false } },
    ],
  }, [tl.t_s.concat(tEnd), closed(tl.requests_per_s)]);

  // Latency: x is the bin's index, labelled with its lower edge in ms, so log-spaced edges
  // give a log axis. Each outcome is drawn as its share of its own requests, so a rare outcome
  // is as readable as the crowd of sold_out answers; the legend shows the count too.
  var hist = result.latency_histogram;
  var edges = hist.edges_ms;
  var bins = Math.max(0, edges.length - 1);
  var xs = [];
  for (var i = 0; bins > 0 && i <= bins; i++) { xs.push(i); }
  var latencySeries = [{
    label: "latency from (ms)",
    value: function (u, v) { return v == null ? "-" : ms(edges[v]); },
  }];
  var latencyData = [xs];
  hist.series.forEach(function (s, k) {
    var total = s.counts.reduce(function (a, b) { return a + b; }, 0);
    var shares = s.counts.map(function (c) { return total ? 100 * c / total : 0; });
    latencySeries.push({
      label: s.action + " " + s.outcome,
      stroke: palette[k % palette.length],
      width: 2,
      paths: steps(),
      points: { show: false },
      value: function (u, v, si, idx) {
        if (v == null || idx == null) { return "-"; }
        return v.toFixed(1) + "% (" + s.counts[Math.min(idx, bins - 1)] + ")";
      },
    });
    latencyData.push(closed(shares));
  });
  draw("chart-latency", {
    scales: { x: { time: false, range: [0, bins] } },
    axes: [
      { label: "latency (ms)", space: 45, incrs: [1, 2, 3, 4, 5, 10, 20, 50],
        values: function (u, splits) {
          return splits.map(function (v) {
            return Number.isInteger(v) && v >= 0 && v <= bins ? ms(edges[v]) : "";
          });
        } },
      { label: "% of the outcome's requests" },
    ],
    series: latencySeries,
  }, latencyData);

  // Stock over time; the backlog (stream entries not yet in SQL) on its own axis.
  var st = result.stock;
  draw("chart-stock", {
    scales: { x: { time: false }, backlog: {} },
    axes: [
      { label: "seconds since the first request" },
      { label: "units" },
      { scale: "backlog", side: 1, label: "backlog (entries)", grid: { show: false } },
    ],
    series: [
      { label: "t (s)" },
      { label: "available", stroke: palette[0], width: 2 },
      { label: "held", stroke: palette[1], width: 2 },
      { label: "sold", stroke: palette[2], width: 2 },
      { label: "backlog", scale: "backlog", stroke: palette[5], width: 1.5, dash: [6, 4] },
    ],
  }, [st.t_s, st.available, st.held, st.sold, st.backlog]);

  // The waiting room: the frontier the inlet moved (each step holds until the next one), from
  // 0 at the start to the end of the run, and, as points, when each buyer let in asked for a
  // ticket, at their position: every point sits on or after the step that let its buyer in.
  var room = result.waiting_room;
  if (room) {
    var stepT = room.admissions.t_s, stepUpto = room.admissions.upto;
    var ticketT = room.tickets.t_s;
    // The crowd's clock gave the start; a step on another host's clock may read earlier.
    var t0 = stepT.length ? Math.min(room.start_s, stepT[0]) : room.start_s;
    var frontier = [[t0].concat(stepT), [0].concat(stepUpto)];
    var last = Math.max(stepT.length ? stepT[stepT.length - 1] : t0,
                        ticketT.length ? ticketT[ticketT.length - 1] : t0);
    if (last > frontier[0][frontier[0].length - 1]) {
      frontier[0].push(last);
      frontier[1].push(frontier[1][frontier[1].length - 1]);
    }
    draw("chart-queue", {
      scales: { x: { time: false } },
      axes: [{ label: "seconds since the first request" }, { label: "position" }],
      series: [
        { label: "t (s)" },
        { label: "admitted up to", stroke: palette[0], width: 2, paths: steps(), spanGaps: true,
          points: { show: false } },
        { label: "tickets", stroke: palette[1], paths: function () { return null; },
          points: { show: true, size: 5, fill: palette[1] } },
      ],
    }, uPlot.join([frontier, [ticketT, room.tickets.position]]));
  }

  window.addEventListener("resize", function () {
    charts.forEach(function (c) { c.plot.setSize({ width: widthOf(c.el), height: height }); });
  });
})();
"""


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
    return _PAGE.substitute(
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
        charts_js=_CHARTS_JS,
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
