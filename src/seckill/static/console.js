// The operator's console: every action is one call of the admin API with the token the operator
// gave, and every one that changes state asks first. The token stays in this tab
// (sessionStorage); a link may carry it in the fragment (#token=...), never sent to the server.
(function () {
  "use strict";

  var API = "api/v1/";  // relative: works behind a path prefix too
  var REFRESH_MS = 2000;
  var PAGE = 50;  // items asked for at a time
  var LISTED = 100;  // dead letters and refunds shown

  var token = null;
  var generation = 0;  // an answer that arrives after the token changed is ignored
  var timer = null;
  var items = {};  // item id -> its row in the list, as last listed
  var shown = PAGE;  // how many items the list holds, kept on refresh
  var nextCursor = null;
  var selected = null;  // the item id in the item panel
  var chosenLetters = {};  // dead letter id -> true, kept across refreshes

  var $ = seckillPage.$, setText = seckillPage.setText, status = seckillPage.status;
  var money = seckillPage.money;

  function element(tag, text, className) {
    var el = document.createElement(tag);
    if (text != null) { el.textContent = String(text); }
    if (className) { el.className = className; }
    return el;
  }

  function row(cells) {
    var tr = document.createElement("tr");
    cells.forEach(function (cell) {
      tr.appendChild(cell instanceof Node ? cell : element("td", cell));
    });
    return tr;
  }

  function fill(body, rows, empty) {
    body.replaceChildren.apply(body, rows);
    if (empty) { empty.hidden = rows.length > 0; }
  }

  function when(iso) {
    return iso ? new Date(iso).toLocaleString(undefined, { hour12: false }) : "-";
  }

  // A sum in minor units of an ISO 4217 currency, in its own decimals: "19.99 EUR", "1999 JPY".
  function reasons(unsettled) {
    return unsettled.map(function (h) { return h.reason + ": " + h.detail; }).join("; ");
  }

  // -- the API ---------------------------------------------------------------------------------

  var Refused = {};  // thrown once the token is refused: the page has already said so

  function call(method, path, body) {
    var gen = generation;
    var headers = { Authorization: "Bearer " + token, Accept: "application/json" };
    if (body !== undefined) { headers["Content-Type"] = "application/json"; }
    return fetch(API + path, {
      method: method, headers: headers, cache: "no-store",
      body: body === undefined ? undefined : JSON.stringify(body),
    }).then(function (response) {
      return response.json().catch(function () { return null; }).then(function (answer) {
        if (gen !== generation) { throw Refused; }
        if (response.status === 401 || response.status === 403) {
          refused(response.status, answer);
          throw Refused;
        }
        return { code: response.status, body: answer };
      });
    }, function () {
      throw new Error("the server is unreachable");
    });
  }

  function why(answer) {
    return answer.body && answer.body.message ? answer.body.message : "HTTP " + answer.code;
  }

  function expect(answer, code) {
    if (answer.code !== code) { throw new Error(why(answer)); }
    return answer.body;
  }

  function failed(error) {
    if (error !== Refused) { status("The server could not answer: " + error.message, "error"); }
  }

  // -- the token -------------------------------------------------------------------------------

  function open(newToken) {
    token = newToken;
    generation += 1;
    if (timer !== null) { clearTimeout(timer); timer = null; }
    $("console").hidden = !token;
    if (token) {
      status("Connecting...", "info");
      refresh(generation, true);
    } else {
      status("Enter an admin token to open the console.", "info");
    }
  }

  // -- refreshing ------------------------------------------------------------------------------

  // Everything on the page, looked at again every REFRESH_MS while the token is good. A look
  // that failed is said until one succeeds.
  var lookFailed = false;

  function refresh(gen, first) {
    Promise.all([loadItems(), loadItem(), loadLetters(), loadRefunds()]).then(function () {
      if (first || lookFailed) { status("", ""); }
      lookFailed = false;
    }, function (error) {
      lookFailed = error !== Refused;
      failed(error);
    }).then(function () {
      if (gen === generation) { timer = setTimeout(function () { refresh(gen); }, REFRESH_MS); }
    });
  }

  function loadItems(cursor) {
    var query = "?limit=" + (cursor ? PAGE : Math.min(500, shown));
    if ($("stage-filter").value) { query += "&stage=" + $("stage-filter").value; }
    if (cursor) { query += "&cursor=" + encodeURIComponent(cursor); }
    return call("GET", "admin/items" + query).then(function (answer) {
      var page = expect(answer, 200);
      var body = $("items-body");
      if (!cursor) { items = {}; body.replaceChildren(); }
      page.items.forEach(function (item) {
        items[item.item_id] = item;
        body.appendChild(itemRow(item));
      });
      shown = Math.max(PAGE, body.children.length);
      nextCursor = page.next_cursor;
      $("more-items").hidden = !nextCursor;
      $("items-empty").hidden = body.children.length > 0;
      if (selected !== null) { showStage(items[selected]); }
    });
  }

  function itemRow(item) {
    var tr = row([
      element("td", item.item_id, "num"),
      item.name + (item.waiting_room ? " (waiting room)" : ""),
      element("td", item.stage, "stage"),
      when(item.starts_at) + " - " + when(item.ends_at),
      reasons(item.unsettled),
    ]);
    tr.className = "item";
    tr.dataset.itemId = item.item_id;
    tr.setAttribute("aria-selected", String(item.item_id === selected));
    tr.addEventListener("click", function () { select(item.item_id); });
    return tr;
  }

  function select(itemId) {
    selected = itemId;
    $("items-body").querySelectorAll("tr").forEach(function (tr) {
      tr.setAttribute("aria-selected", String(Number(tr.dataset.itemId) === itemId));
    });
    $("item-result").replaceChildren();
    $("item-none").hidden = true;
    $("item-detail").hidden = false;
    setText($("item-id"), itemId);
    showStage(items[itemId]);
    loadItem().catch(failed);
  }

  function showStage(item) {
    setText($("item-stage"), item ? item.stage : null);
    setText($("item-unsettled"), item && item.unsettled.length
      ? "kept from archiving by " + reasons(item.unsettled) : "");
  }

  function loadItem() {
    if (selected === null) { return Promise.resolve(); }
    var itemId = selected;
    return Promise.all([
      call("GET", "items/" + itemId), call("GET", "admin/items/" + itemId),
    ]).then(function (answers) {
      if (itemId !== selected) { return; }
      var card = expect(answers[0], 200);
      var counters = expect(answers[1], 200);
      setText($("item-name"), card.name);
      setText($("item-card"), money(card.price_cents, card.currency) + " · limit " + card.per_buyer_limit +
        " a buyer · holds " + card.hold_seconds + " s · " + card.stock_shards + " shard(s)" +
        (card.waiting_room ? " · waiting room" : " · sells directly"));
      var link = $("wait-link");
      link.hidden = !card.waiting_room;
      link.href = "wait/" + itemId;
      showCounters($("counters-redis"), counters.redis);
      showCounters($("counters-sql"), counters.sql);
      setText($("backlog"), counters.backlog);
      var agree = $("agree");
      if (counters.redis) {
        setText(agree, counters.agree ? "Redis and SQL agree" : "Redis and SQL differ");
        agree.className = counters.agree ? "ok" : "bad";
      } else {
        var archived = items[itemId] && items[itemId].stage === "archived";
        setText(agree, archived ? "archived: SQL keeps it" : "not in Redis: warm it to sell it");
        agree.className = "muted";
      }
    });
  }

  function showCounters(tr, counters) {
    var cells = tr.querySelectorAll("td");
    ["total", "available", "held", "sold"].forEach(function (field, k) {
      setText(cells[k], counters ? counters[field] : null);
    });
  }

  function loadLetters() {
    var query = "?limit=" + LISTED + ($("settled-letters").checked ? "&settled=true" : "");
    return call("GET", "admin/dead-letters" + query).then(function (answer) {
      var letters = expect(answer, 200).dead_letters;
      fill($("letters-body"), letters.map(letterRow), $("letters-empty"));
    });
  }

  function letterRow(letter) {
    var pending = !letter.replayed_at && !letter.dropped_at;
    var box = element("input");
    box.type = "checkbox";
    box.disabled = !pending;
    box.checked = pending && !!chosenLetters[letter.id];
    box.setAttribute("aria-label", "choose " + letter.id);
    box.addEventListener("change", function () {
      if (box.checked) { chosenLetters[letter.id] = true; } else { delete chosenLetters[letter.id]; }
    });
    var cell = element("td");
    cell.appendChild(box);
    var state = letter.replayed_at ? "replayed " + when(letter.replayed_at)
      : letter.dropped_at ? "dropped " + when(letter.dropped_at) : "pending";
    var tr = row([cell, letter.group, letter.stream + " " + letter.entry_id, letter.error,
                  when(letter.died_at), state]);
    tr.dataset.letterId = letter.id;
    return tr;
  }

  function loadRefunds() {
    var state = $("refund-state").value;
    var query = "?limit=" + LISTED + (state ? "&state=" + state : "");
    return call("GET", "admin/refunds" + query).then(function (answer) {
      var refunds = expect(answer, 200).refunds;
      fill($("refunds-body"), refunds.map(refundRow), $("refunds-empty"));
    });
  }

  function refundRow(refund) {
    var cell = element("td");
    if (refund.state === "owed") {
      var button = element("button", "Mark refunded");
      button.type = "button";
      button.addEventListener("click", function () { markRefunded(refund); });
      cell.appendChild(button);
    } else {
      cell.textContent = "refunded " + when(refund.refunded_at);
    }
    // An unknown order's refund has no buyer: nobody here knows whose the charge was.
    var tr = row([element("td", refund.item_id, "num"), refund.payment_id, refund.buyer || "-",
                  element("td", money(refund.amount_cents, refund.currency), "num"),
                  refund.reason, cell]);
    tr.dataset.paymentId = refund.payment_id;
    return tr;
  }

  // -- actions ---------------------------------------------------------------------------------

  function confirmed(text) {
    var dialog = $("confirm");
    setText($("confirm-text"), text);
    dialog.returnValue = "";
    dialog.showModal();
    return new Promise(function (resolve) {
      dialog.addEventListener("close", function () {
        resolve(dialog.returnValue === "yes");
      }, { once: true });
    });
  }

  // Run ``work`` (a promise of a message) once the operator agrees, if ``question`` is given;
  // report its message, then look again at everything.
  function act(question, work) {
    var asked = question ? confirmed(question) : Promise.resolve(true);
    return asked.then(function (yes) {
      if (!yes) { return; }
      status("Working...", "info");
      return work().then(function (message) {
        status(message, "done");
      }).catch(failed).then(function () {
        return Promise.all([loadItems(), loadItem(), loadLetters(), loadRefunds()]);
      }).catch(failed);
    });
  }

  function result(target, title, lines, good) {
    var box = $(target);
    var head = element("div", title, good ? "ok" : "bad");
    var list = element("ul", null, "findings");
    lines.forEach(function (line) { list.appendChild(element("li", line)); });
    box.replaceChildren(head, list);
  }

  function finding(f) {
    return f.kind + " (" + f.subject + "): Redis " + f.redis + ", SQL " + f.sql +
      (f.detail ? ", " + f.detail : "");
  }

  function readForm(form) {
    var body = {};
    var values = new FormData(form);
    ["name"].forEach(function (name) { body[name] = values.get(name).trim(); });
    var currency = values.get("currency").trim().toUpperCase();
    if (currency !== "") { body.currency = currency; }  // else the server's default
    ["price_cents", "total", "per_buyer_limit", "hold_seconds", "stock_shards",
     "queue_admit_per_second", "queue_open_seconds"].forEach(function (name) {
      var text = values.get(name);
      if (text !== "") { body[name] = Number(text); }
    });
    ["starts_at", "ends_at"].forEach(function (name) {
      var at = new Date(values.get(name));  // the operator's local time
      if (isNaN(at)) { throw new Error(name + ": not a date and time"); }
      body[name] = at.toISOString();
    });
    body.waiting_room = values.get("waiting_room") === "on";
    return body;
  }

  function localInput(date) {
    function two(n) { return String(n).padStart(2, "0"); }
    return date.getFullYear() + "-" + two(date.getMonth() + 1) + "-" + two(date.getDate()) +
      "T" + two(date.getHours()) + ":" + two(date.getMinutes()) + ":" + two(date.getSeconds());
  }

  $("create-form").addEventListener("submit", function (event) {
    event.preventDefault();
    var body;
    try { body = readForm(event.target); } catch (error) { status(error.message, "error"); return; }
    act("Create \"" + body.name + "\" with " + body.total + " units, on sale from " +
        when(body.starts_at) + " to " + when(body.ends_at) + "?", function () {
      return call("POST", "admin/items", body).then(function (answer) {
        var item = expect(answer, 201);
        select(item.item_id);
        return "Item " + item.item_id + " created. Warm it to put it on sale.";
      });
    });
  });

  $("warm").addEventListener("click", function () {
    var itemId = selected;
    act("Warm item " + itemId + ": load it from SQL into Redis, where it is sold?", function () {
      return call("POST", "admin/items/" + itemId + "/warm").then(function (answer) {
        if (answer.code === 409) {
          return confirmed(why(answer) + " Reload it, keeping its holds and sales?")
            .then(function (yes) {
              if (!yes) { return "Not reloaded."; }
              return call("POST", "admin/items/" + itemId + "/warm?force=true").then(warmed);
            });
        }
        return warmed(answer);
      });
    });

    function warmed(answer) {
      return "Item " + itemId + " warmed: " + expect(answer, 200).outcome + ".";
    }
  });

  $("audit").addEventListener("click", function () {
    var itemId = selected;
    act(null, function () {
      return call("GET", "admin/items/" + itemId + "/audit").then(function (answer) {
        var audit = expect(answer, 200);
        result("item-result", audit.passed ? "Audit passed" : "Audit failed",
          audit.checks.map(function (c) { return (c.ok ? "pass " : "FAIL ") + c.name + ": " +
                                              c.detail; }), audit.passed);
        return "Item " + itemId + " audited.";
      });
    });
  });

  $("drift").addEventListener("click", function () {
    var itemId = selected;
    act(null, function () {
      return call("GET", "admin/items/" + itemId + "/drift").then(function (answer) {
        var drift = expect(answer, 200);
        result("item-result", drift.agree ? "No drift: Redis and SQL agree" : "Drift found",
               drift.found.map(finding), drift.agree);
        return "Item " + itemId + " compared as of " + drift.position + ".";
      });
    });
  });

  $("repair").addEventListener("click", function () {
    var itemId = selected;
    act("Repair item " + itemId + "'s drift (each repair journaled)?", function () {
      return call("POST", "admin/items/" + itemId + "/repair").then(function (answer) {
        var drift = expect(answer, 200);
        var lines = drift.repairs.map(function (r) { return "repaired " + r.kind + ": " + r.action; })
          .concat(drift.left.map(function (f) { return "left: " + finding(f); }));
        result("item-result", drift.agree ? "Repaired: Redis and SQL agree" : "Drift left",
               lines, drift.agree);
        return "Item " + itemId + ": " + drift.repairs.length + " repair(s).";
      });
    });
  });

  $("end").addEventListener("click", function () {
    var itemId = selected;
    act("End item " + itemId + "'s sale now? No ticket or purchase is taken after it; holds " +
        "taken before may still be paid until their deadline.", function () {
      return call("POST", "admin/items/" + itemId + "/end").then(function (answer) {
        var item = expect(answer, 200);
        return "Item " + itemId + "'s sale ended at " + when(item.ends_at) + ".";
      });
    });
  });

  $("archive").addEventListener("click", function () {
    var itemId = selected;
    act("Archive item " + itemId + ": its keys leave Redis and SQL answers for it?", function () {
      return call("POST", "admin/items/" + itemId + "/archive").then(function (answer) {
        if (answer.code === 409) {
          result("item-result", "Not archived", [why(answer)], false);
          return "Item " + itemId + " is not settled: nothing changed.";
        }
        var done = expect(answer, 200);
        result("item-result", "Archived", done.removed ? ["its keys left Redis"]
          : ["still in Redis: " + reasons(done.unsettled)], true);
        return "Item " + itemId + " archived.";
      });
    });
  });

  function settleLetters(verb) {
    var ids = Object.keys(chosenLetters);
    if (!ids.length) { status("Choose the dead letters first.", "error"); return; }
    var what = verb === "replay" ? "Replay" : "Drop for good";
    act(what + " " + ids.length + " dead letter(s)?", function () {
      return call("POST", "admin/dead-letters/" + verb, { ids: ids }).then(function (answer) {
        var done = expect(answer, 200);
        chosenLetters = {};
        var lines = done.letters.map(function (l) {
          return l.id + ": " + (l.refused ? "still pending, " + l.refused : verb + "ed");
        }).concat(done.missing.map(function (id) { return id + ": no pending dead letter"; }));
        result("letters-result", done.ok ? "Done" : "Not all settled", lines, done.ok);
        return ids.length + " dead letter(s): " + (done.ok ? verb + "ed" : "see the list") + ".";
      });
    });
  }

  function markRefunded(refund) {
    var sum = money(refund.amount_cents, refund.currency);
    act("Mark payment " + refund.payment_id + "'s refund of " + sum + " given back?", function () {
      // In the body, not the path: a browser collapses a payment id of "." or ".." there.
      var body = { item_id: refund.item_id, payment_id: refund.payment_id };
      return call("POST", "admin/refunds/refunded", body).then(function (answer) {
        expect(answer, 200);
        return "Refund of payment " + refund.payment_id + " marked given back.";
      });
    });
  }

  $("replay").addEventListener("click", function () { settleLetters("replay"); });
  $("drop").addEventListener("click", function () { settleLetters("drop"); });
  $("refresh").addEventListener("click", function () { loadItems().catch(failed); });
  $("stage-filter").addEventListener("change", function () {
    shown = PAGE;
    loadItems().catch(failed);
  });
  $("more-items").addEventListener("click", function () { loadItems(nextCursor).catch(failed); });
  $("settled-letters").addEventListener("change", function () { loadLetters().catch(failed); });
  $("refund-state").addEventListener("change", function () { loadRefunds().catch(failed); });

  var now = new Date();
  var form = $("create-form");
  form.elements.starts_at.value = localInput(now);
  form.elements.ends_at.value = localInput(new Date(now.getTime() + 3600 * 1000));

  var refused = seckillPage.adminToken(open);
})();
