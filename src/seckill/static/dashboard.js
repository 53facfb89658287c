// The dashboard: polls the admin snapshot every second with the token the operator gave, and
// draws what it saw since the page opened. The token stays in this tab (sessionStorage); a
// link may carry it in the fragment (#token=...), which browsers never send to the server.
(function () {
  "use strict";

  var DATA_URL = "api/v1/admin/dashboard";  // relative: works behind a path prefix too
  var POLL_MS = 1000;
  var MAX_POINTS = 3600;  // an hour of polls; older points are dropped
  var HEIGHT = 180;
  var STOCK = [
    { field: "available", color: "#1a7f37" },
    { field: "held", color: "#bf8700" },
    { field: "sold", color: "#0969da" },
  ];
  var PALETTE = ["#1a7f37", "#cf222e", "#bf8700", "#8250df", "#0969da", "#6e7781",
                 "#1b7c83", "#e85aad", "#bc4c00", "#4d2d00"];

  var token = null;
  var timer = null;
  var generation = 0;  // a poll answered after the token changed is ignored
  var items = {};  // item id -> its card, numbers and series
  var charts = [];  // every plot, for resizing
  var previous = null;  // the last request counters seen, to turn them into rates
  var purchases = { rows: [], outcomes: [], plot: null };

  var $ = seckillPage.$, setText = seckillPage.setText, status = seckillPage.status;

  function clock(date) { return date.toLocaleTimeString(undefined, { hour12: false }); }

  function when(iso, now) {
    if (!iso) { return null; }
    var at = new Date(iso);
    var ago = Math.max(0, Math.round((now - at) / 1000));
    return clock(at) + " (" + ago + " s ago)";
  }

  // -- the token -------------------------------------------------------------------------------

  function watch(newToken) {
    token = newToken;
    generation += 1;
    previous = null;
    if (timer !== null) { clearTimeout(timer); timer = null; }
    if (token) {
      status("Connecting...", "info");
      poll(generation);
    } else {
      status("Enter an admin token to watch the sale.", "info");
    }
  }

  // -- polling ---------------------------------------------------------------------------------

  function poll(gen) {
    fetch(DATA_URL + location.search, {
      headers: { Authorization: "Bearer " + token, Accept: "application/json" },
      cache: "no-store",
    }).then(function (response) {
      return response.json().catch(function () { return null; }).then(function (body) {
        return { code: response.status, body: body };
      });
    }).then(function (answer) {
      if (gen !== generation) { return; }
      if (answer.code === 401 || answer.code === 403) { refused(answer.code, answer.body); return; }
      if (answer.code !== 200) {
        var why = answer.body && answer.body.message ? answer.body.message : "HTTP " + answer.code;
        status("The server could not answer: " + why + ". Retrying.", "error");
      } else {
        status("", "");
        show(answer.body);
      }
      timer = setTimeout(function () { poll(gen); }, POLL_MS);
    }, function () {
      if (gen !== generation) { return; }
      status("The server is unreachable. Retrying.", "error");
      timer = setTimeout(function () { poll(gen); }, POLL_MS);
    });
  }

  // -- drawing ---------------------------------------------------------------------------------

  function widthOf(el) { return Math.max(260, el.clientWidth); }

  function plot(el, series, data) {
    var opts = {
      width: widthOf(el),
      height: HEIGHT,
      legend: { live: false },
      cursor: { drag: { x: false, y: false } },
      scales: { y: { range: function (u, min, max) { return [0, Math.max(1, max * 1.1)]; } } },
      series: [{}].concat(series.map(function (s) {
        return { label: s.label, stroke: s.color, width: 2, points: { show: false } };
      })),
      axes: [{}, { size: 50 }],
    };
    var chart = { el: el, plot: new uPlot(opts, data, el) };
    charts.push(chart);
    return chart;
  }

  function drop(chart) {
    charts.splice(charts.indexOf(chart), 1);
    chart.plot.destroy();
  }

  function push(list, value) {
    list.push(value);
    if (list.length > MAX_POINTS) { list.shift(); }
  }

  function number(id, field, label) {
    return '<div><dt>' + label + '</dt><dd data-item="' + id + '" data-field="' + field +
           '">-</dd></div>';
  }

  function card(id) {
    var el = document.createElement("section");
    el.className = "card";
    el.id = "item-" + id;
    el.dataset.item = id;
    el.innerHTML =
      "<h2>Item " + id + ' <span class="muted" data-role="state"></span></h2>' +
      '<dl class="numbers">' + number(id, "total", "total") + number(id, "available", "available") +
      number(id, "held", "held") + number(id, "sold", "sold") + "</dl>" +
      "<h3>Stock</h3>" + '<div class="chart" data-chart="stock"></div>' +
      '<dl class="numbers">' + number(id, "backlog", "backlog") +
      number(id, "pending", "pending") + number(id, "lag", "lag") +
      number(id, "dead_letters", "dead letters") +
      number(id, "refunds_owed", "refunds owed") + "</dl>" +
      "<h3>Stream to SQL</h3>" + '<div class="chart" data-chart="queue"></div>' +
      '<div class="muted" data-role="sinks" hidden>to brokers: <span></span></div>' +
      '<div data-role="waiting-room" hidden><h3>Waiting room</h3>' +
      '<dl class="numbers">' + number(id, "joined", "joined") +
      number(id, "admitted_up_to", "admitted up to") + number(id, "waiting", "waiting") +
      "</dl>" + '<div class="chart" data-chart="waiting-room"></div></div>' +
      '<div class="updated">updated <span class="updated-at">never</span></div>';
    $("items").appendChild(el);
    var view = {
      el: el,
      numbers: {},
      t: [], available: [], held: [], sold: [], backlog: [], lag: [], waiting: [], admitted: [],
      room: el.querySelector('[data-role="waiting-room"]'),
      roomPlot: null,  // drawn once someone joins (uPlot needs a visible box to size itself)
    };
    el.querySelectorAll("[data-field]").forEach(function (n) { view.numbers[n.dataset.field] = n; });
    view.stock = plot(el.querySelector('[data-chart="stock"]'), STOCK.map(function (s) {
      return { label: s.field, color: s.color };
    }), [[], [], [], []]);
    view.queue = plot(el.querySelector('[data-chart="queue"]'), [
      { label: "backlog", color: "#8250df" }, { label: "lag", color: "#6e7781" },
    ], [[], [], []]);
    return view;
  }

  function showItem(item, t, updated) {
    var view = items[item.item_id] || (items[item.item_id] = card(item.item_id));
    var redis = item.redis;
    view.el.querySelector('[data-role="state"]').textContent = redis ? "" : "(not in Redis)";
    ["total", "available", "held", "sold"].forEach(function (f) {
      setText(view.numbers[f], redis ? redis[f] : null);
    });
    setText(view.numbers.backlog, item.backlog);
    setText(view.numbers.pending, item.pending);
    setText(view.numbers.lag, item.lag);
    setText(view.numbers.dead_letters, item.dead_letters);
    view.numbers.dead_letters.className = item.dead_letters ? "bad" : "";
    var owed = item.refunds_owed;
    setText(view.numbers.refunds_owed, owed ? owed.count + money(owed.amounts) : null);
    view.numbers.refunds_owed.className = owed && owed.count ? "bad" : "";
    push(view.t, t);
    STOCK.forEach(function (s) { push(view[s.field], redis ? redis[s.field] : null); });
    push(view.backlog, item.backlog);
    push(view.lag, item.lag);
    view.stock.plot.setData([view.t, view.available, view.held, view.sold]);
    view.queue.plot.setData([view.t, view.backlog, view.lag]);
    showWaitingRoom(view, item.queue);
    showSinks(view.el.querySelector('[data-role="sinks"]'), item.sinks || {});
    setText(view.el.querySelector(".updated-at"), updated);
  }

  // Other consumer groups (a bridge to a broker): their backlog beside the persister's.
  function showSinks(el, sinks) {
    var names = Object.keys(sinks).sort();
    el.hidden = names.length === 0;
    setText(el.querySelector("span"), names.map(function (n) {
      return n + " backlog " + sinks[n];
    }).join(", "));
  }

  function showWaitingRoom(view, queue) {
    push(view.waiting, queue ? queue.waiting : null);
    push(view.admitted, queue ? queue.admitted_up_to : null);
    if (!queue && !view.roomPlot) { return; }
    view.room.hidden = false;
    setText(view.numbers.joined, queue ? queue.joined : null);
    setText(view.numbers.admitted_up_to, queue ? queue.admitted_up_to : null);
    setText(view.numbers.waiting, queue ? queue.waiting : null);
    if (!view.roomPlot) {
      view.roomPlot = plot(view.room.querySelector('[data-chart="waiting-room"]'), [
        { label: "waiting", color: "#bc4c00" }, { label: "admitted up to", color: "#1b7c83" },
      ], [[], [], []]);
    }
    view.roomPlot.plot.setData([view.t, view.waiting, view.admitted]);
  }

  // Purchases per second by outcome, from the growth of the purchase route's counters.
  function showPurchases(data, t) {
    var counts = {};
    data.requests.forEach(function (r) {
      if (/\/orders$/.test(r.route)) { counts[r.outcome] = (counts[r.outcome] || 0) + r.count; }
    });
    var last = previous;
    previous = { t: t, source: data.metrics_source, counts: counts };
    // Another process (behind a balancer) or a restart: its counters are not comparable.
    if (!last || last.source !== data.metrics_source || t <= last.t) { return; }
    var rates = {};
    Object.keys(counts).forEach(function (outcome) {
      var grown = counts[outcome] - (last.counts[outcome] || 0);
      rates[outcome] = grown < 0 ? 0 : grown / (t - last.t);
      if (purchases.outcomes.indexOf(outcome) < 0) { purchases.outcomes.push(outcome); }
    });
    purchases.rows.push({ t: t, rates: rates });
    if (purchases.rows.length > MAX_POINTS) { purchases.rows.shift(); }
    var outcomes = purchases.outcomes.slice().sort();
    var series = [purchases.rows.map(function (r) { return r.t; })].concat(
      outcomes.map(function (o) {
        return purchases.rows.map(function (r) { return r.rates[o] || 0; });
      }));
    var shown = purchases.plot && purchases.plot.outcomes.join(",");
    if (shown === outcomes.join(",")) {
      purchases.plot.plot.setData(series);
      return;
    }
    if (purchases.plot) { drop(purchases.plot); }
    purchases.plot = plot($("chart-purchases"), outcomes.map(function (o, k) {
      return { label: o, color: PALETTE[k % PALETTE.length] };
    }), series);
    purchases.plot.outcomes = outcomes;
  }

  // " (12.34 EUR, 500 JPY)": sums by currency (minor units), shown beside a count; never added
  // across currencies.
  function money(amounts) {
    var shown = Object.keys(amounts).sort().filter(function (c) { return amounts[c]; });
    return shown.length ? " (" + shown.map(function (c) {
      return seckillPage.money(amounts[c], c);
    }).join(", ") + ")" : "";
  }

  function showWorkers(data, now, updated) {
    var dead = 0;
    var known = data.database_available;
    data.items.forEach(function (i) { dead += i.dead_letters || 0; });
    var deadEl = $("dead-letters");
    setText(deadEl, known ? dead : "SQL unavailable");
    deadEl.className = known && dead === 0 ? "ok" : "bad";
    setText($("dead-letters-recorded"), data.dead_letters_recorded);
    var refunds = 0;
    var amounts = {};  // currency -> minor units
    data.items.forEach(function (i) {
      if (!i.refunds_owed) { return; }
      refunds += i.refunds_owed.count;
      Object.keys(i.refunds_owed.amounts).forEach(function (c) {
        amounts[c] = (amounts[c] || 0) + i.refunds_owed.amounts[c];
      });
    });
    var owedEl = $("refunds-owed");
    setText(owedEl, known ? refunds + money(amounts) : "SQL unavailable");
    owedEl.className = known && refunds === 0 ? "ok" : "bad";
    var reaper = data.reaper;
    setText($("reaper-last-pass"), when(reaper.last_pass_at, now) || "none seen by this process");
    setText($("reaper-releases"), reaper.releases);
    var rec = data.reconciler;
    setText($("reconciler-last-pass"), when(rec.last_pass_at, now) || "none seen by this process");
    var drifted = Object.keys(rec.drift).filter(function (k) { return rec.drift[k] > 0; });
    var driftEl = $("reconciler-drift");
    if (drifted.length) {
      setText(driftEl, drifted.map(function (k) { return k + " " + rec.drift[k]; }).join(", "));
      driftEl.className = "bad";
    } else if (rec.last_pass_at) {
      setText(driftEl, "no drift");
      driftEl.className = "ok";
    } else {
      setText(driftEl, "-");
      driftEl.className = "";
    }
    setText($("workers-updated-at"), updated);
  }

  function showRequests(data, updated) {
    var rows = data.requests.map(function (r) {
      var tr = document.createElement("tr");
      [r.route, r.outcome, r.count].forEach(function (v, k) {
        var td = document.createElement("td");
        td.textContent = v;
        if (k === 2) { td.className = "num"; }
        tr.appendChild(td);
      });
      return tr;
    });
    $("requests-body").replaceChildren.apply($("requests-body"), rows);
    setText($("metrics-source"), "by " + data.metrics_source);
    setText($("requests-updated-at"), updated);
  }

  function show(data) {
    var now = new Date(data.server_time);
    var t = now.getTime() / 1000;
    var updated = clock(now);
    setText($("server"), data.server);
    setText($("server-time"), updated);
    setText($("updated-at"), clock(new Date()));
    data.items.forEach(function (item) { showItem(item, t, updated); });
    var note = data.items.length ? "" : "No item has been loaded into Redis yet.";
    if (data.items.length < data.items_in_registry) {
      note = "Showing " + data.items.length + " of " + data.items_in_registry +
             " items (the newest); add ?item=ID to the address to choose.";
    }
    setText($("items-note"), note);
    showPurchases(data, t);
    showWorkers(data, now, updated);
    showRequests(data, updated);
  }

  window.addEventListener("resize", function () {
    charts.forEach(function (c) { c.plot.setSize({ width: widthOf(c.el), height: HEIGHT }); });
  });

  var refused = seckillPage.adminToken(watch);
})();
