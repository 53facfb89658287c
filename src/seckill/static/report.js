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
