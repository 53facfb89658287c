// The waiting page: joins the item's waiting room with the buyer's token, polls where the buyer
// stands (at most once a second), and buys when let in. The token stays in this tab
// (sessionStorage) and goes only in the Authorization header; a link may carry it in the
// fragment (#token=...), which browsers never send to the server.
(function () {
  "use strict";

  var POLL_MS = 1000;  // never faster
  var NOT_OPEN_MS = 5000;  // the queue opens a while before the sale: ask again now and then
  var MAX_BACKOFF_MS = 10000;
  var ITEM = location.pathname.replace(/\/+$/, "").split("/").pop();
  // Relative: works behind a path prefix too (the page is at .../wait/<item>).
  var ITEM_URL = "../api/v1/items/" + ITEM;
  var QUEUE_URL = ITEM_URL + "/queue";
  var TOKEN_KEY = "seckill.wait.token";
  var PREFIX = "seckill.wait." + ITEM + ".";  // this item's pass, pending purchase key, order
  var PASS_KEY = PREFIX + "pass";
  var BUY_KEY = PREFIX + "key";
  var ORDER_KEY = PREFIX + "order";
  var HEADLINES = {
    waiting: "Waiting in line",
    admitted: "It's your turn",
    sold_out: "Sold out",
    ended: "The sale has ended",
  };

  var token = null;
  var timer = null;
  var generation = 0;  // an answer that comes after the token changed is ignored
  var failures = 0;  // polls failed in a row, for the backoff
  var buying = false;

  var $ = seckillPage.$, setText = seckillPage.setText, status = seckillPage.status;

  function why(answer) {
    return answer.body && answer.body.message ? answer.body.message : "HTTP " + answer.code;
  }

  function read(fetched) {
    return fetched.then(function (response) {
      return response.json().catch(function () { return null; }).then(function (body) {
        return { code: response.status, body: body, headers: response.headers };
      });
    });
  }

  // A request as the buyer (the token in its Authorization header), its answer read.
  function call(method, url, headers, body) {
    var sent = { Accept: "application/json", Authorization: "Bearer " + token };
    Object.keys(headers || {}).forEach(function (name) { sent[name] = headers[name]; });
    var init = { method: method, headers: sent, cache: "no-store" };
    if (body !== undefined) {
      sent["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    return read(fetch(url, init));
  }

  // A purchase's Idempotency-Key. randomUUID needs a secure context (https, or this machine).
  function newKey() {
    if (window.crypto.randomUUID) { return window.crypto.randomUUID(); }
    var bytes = window.crypto.getRandomValues(new Uint8Array(16));
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    var hex = Array.prototype.map.call(bytes, function (b) {
      return (b + 0x100).toString(16).slice(1);
    }).join("");
    return [hex.slice(0, 8), hex.slice(8, 12), hex.slice(12, 16), hex.slice(16, 20),
            hex.slice(20)].join("-");
  }

  // -- the token -------------------------------------------------------------------------------

  function useToken(value) {
    // Another buyer's pass, purchase or order is not this one's.
    if (value !== sessionStorage.getItem(TOKEN_KEY)) { forgetItem(); }
    sessionStorage.setItem(TOKEN_KEY, value);
  }

  function tokenFromFragment() {
    var taken = seckillPage.fragmentToken();
    if (taken) { useToken(taken); }
  }

  function forgetItem() {
    [PASS_KEY, BUY_KEY, ORDER_KEY].forEach(function (key) { sessionStorage.removeItem(key); });
  }

  function stop() {
    generation += 1;
    if (timer !== null) { clearTimeout(timer); timer = null; }
  }

  function start(newToken) {
    stop();
    token = newToken;
    failures = 0;
    $("login").hidden = !!token;
    $("forget").hidden = !token;
    $("standing").hidden = true;
    $("order").hidden = true;
    if (!token) {
      status("Enter your buyer token to join the queue.", "info");
      return;
    }
    var order = sessionStorage.getItem(ORDER_KEY);
    if (order) {
      showOrder(JSON.parse(order));
      return;
    }
    status("Joining the queue...", "info");
    ask(generation);
  }

  function refused(answer) {
    sessionStorage.removeItem(TOKEN_KEY);
    forgetItem();
    start(null);
    status((answer.code === 401 ? "Your token was refused: " : "This token is not a buyer's: ") +
           why(answer) + ". Enter your buyer token.", "error");
    $("token").focus();
  }

  // -- the queue -------------------------------------------------------------------------------

  function later(gen, ms) {
    if (gen !== generation) { return; }
    timer = setTimeout(function () { timer = null; ask(gen); }, Math.max(POLL_MS, ms));
  }

  // Join (no pass yet) or ask where we stand (with the newest pass); again a second after.
  function ask(gen) {
    var queuePass = sessionStorage.getItem(PASS_KEY);
    var asked = queuePass
      ? call("GET", QUEUE_URL, { "Seckill-Queue-Pass": queuePass })
      : call("POST", QUEUE_URL);
    asked.then(function (answer) {
      if (gen !== generation) { return; }
      var code = answer.body && answer.body.error;
      if (answer.code === 200) {
        failures = 0;
        sessionStorage.setItem(PASS_KEY, answer.body.pass);
        if (!buying) { status("", ""); }
        showStanding(answer.body);
        if (!over(answer.body.state)) { later(gen, POLL_MS); }
      } else if (answer.code === 401 || code === "forbidden") {
        refused(answer);
      } else if (code === "invalid_pass") {
        sessionStorage.removeItem(PASS_KEY);  // join again: that answers our place, a new pass
        later(gen, POLL_MS);
      } else if (code === "ended") {
        showOver(code);
      } else if (code === "not_started") {
        status("The queue is not open yet: " + why(answer) + ". Trying again shortly.", "info");
        later(gen, NOT_OPEN_MS);
      } else if (answer.code === 404) {
        status(why(answer) + ".", "error");  // no such item, or no waiting room
      } else {
        var seconds = Number(answer.headers.get("Retry-After"));
        trouble(gen, "The server could not answer: " + why(answer), seconds * 1000 || 0);
      }
    }, function () {
      trouble(gen, "The server is unreachable", 0);
    });
  }

  function trouble(gen, message, ms) {
    if (gen !== generation) { return; }
    failures += 1;
    status(message + ". Retrying.", "error");
    later(gen, Math.max(ms, Math.min(MAX_BACKOFF_MS, POLL_MS * Math.pow(2, failures - 1))));
  }

  function over(state) { return state === "sold_out" || state === "ended"; }

  function waitText(seen) {
    if (seen.state === "admitted") { return "none"; }
    if (seen.state !== "waiting") { return "-"; }
    var s = seen.estimated_wait_s;
    if (s == null) { return "unknown"; }
    var text = s < 60 ? "about " + s + " s" : s < 3600 ? "about " + Math.ceil(s / 60) + " min"
      : "about " + Math.floor(s / 3600) + " h " + Math.ceil((s % 3600) / 60) + " min";
    return seen.position == null ? text + " until the draw" : text;
  }

  function showStanding(seen) {
    $("standing").hidden = false;
    setText($("position"), seen.position == null
      ? (seen.state === "waiting" ? "drawn at the start" : null) : seen.position);
    setText($("ahead"), seen.ahead);
    setText($("wait"), waitText(seen));
    setText($("admitted-up-to"), seen.admitted_up_to);
    var bar = $("progress");
    if (seen.position == null) {
      bar.removeAttribute("value");  // indeterminate until the draw
      bar.removeAttribute("aria-valuetext");
    } else {
      bar.max = seen.position;
      bar.value = Math.min(seen.admitted_up_to, seen.position);
      bar.setAttribute("aria-valuetext", "let in up to place " + seen.admitted_up_to +
                       ", yours is " + seen.position);
    }
    showState(seen.state);
  }

  function showState(state) {
    var section = $("standing");
    section.dataset.state = state;
    setText($("headline"), HEADLINES[state] || state);
    $("turn").hidden = state !== "admitted";
  }

  // The wait is over (sold out, ended): said once, no more polls.
  function showOver(state) {
    stop();
    $("standing").hidden = false;
    showState(state);
  }

  // -- buying ----------------------------------------------------------------------------------

  // One click: a ticket, then the purchase. Its key is kept until the answer is known, so a
  // retry of the same click (after a lost answer, an overload) cannot buy twice.
  function buy() {
    if (buying || !token) { return; }
    buying = true;
    $("buy").disabled = true;
    var key = sessionStorage.getItem(BUY_KEY);
    if (!key) {
      key = newKey();
      sessionStorage.setItem(BUY_KEY, key);
    }
    status("Buying...", "info");
    call("POST", ITEM_URL + "/tickets").then(function (answer) {
      if (answer.code !== 200) { return answer; }
      var headers = { "Idempotency-Key": key, "Seckill-Ticket": answer.body.ticket };
      return call("POST", ITEM_URL + "/orders", headers, { quantity: 1 });
    }).then(bought, function () {
      done("The server is unreachable: try again.", "error", true);
    });
  }

  function bought(answer) {
    var code = answer.body && answer.body.error;
    if (answer.code === 202 || answer.code === 200) {
      sessionStorage.removeItem(BUY_KEY);
      sessionStorage.setItem(ORDER_KEY, JSON.stringify(answer.body));
      done("", "", false);
      showOrder(answer.body);
    } else if (answer.code === 401 || code === "forbidden") {
      done("", "", false);
      refused(answer);
    } else if (code === "sold_out" || code === "ended") {
      sessionStorage.removeItem(BUY_KEY);
      done("", "", false);
      showOver(code);
    } else if (code === "gate_refused") {
      // Not let in after all: wait on, and keep the key for the next click.
      done(why(answer) + ".", "info", true);
    } else if (answer.code === 429 || answer.code >= 500) {
      var seconds = answer.headers.get("Retry-After");
      done(why(answer) + (seconds ? ": try again in " + seconds + " s." : ": try again."),
           "error", true);
    } else {
      sessionStorage.removeItem(BUY_KEY);  // a definite refusal: another click is another purchase
      done(why(answer) + ".", "error", false);
    }
  }

  function done(message, state, retry) {
    buying = false;
    $("buy").disabled = false;
    setText($("buy"), retry ? "Try again" : "Buy");
    status(message, state);
  }

  function showOrder(order) {
    stop();
    $("standing").hidden = true;
    $("order").hidden = false;
    setText($("order-id"), order.order_id);
    var payBefore = $("pay-before");
    payBefore.dateTime = order.pay_before;
    setText(payBefore, new Date(order.pay_before).toLocaleString(undefined, { hour12: false }));
  }

  // -- the item --------------------------------------------------------------------------------

  // Anyone may read the item: no token goes with it.
  function showItem() {
    var init = { headers: { Accept: "application/json" }, cache: "no-store" };
    read(fetch(ITEM_URL, init)).then(function (answer) {
      if (answer.code !== 200) {
        setText($("item-name"), "Item " + ITEM);
        setText($("item-details"), why(answer));
        return;
      }
      var item = answer.body;
      document.title = item.name + " - waiting room";
      setText($("item-name"), item.name);
      setText($("item-details"), "Price " + seckillPage.money(item.price_cents, item.currency) +
              ", at most " + item.per_buyer_limit + " per buyer");
    }, function () {
      setText($("item-name"), "Item " + ITEM);
    });
  }

  $("login").addEventListener("submit", function (event) {
    event.preventDefault();
    var value = $("token").value.trim();
    if (!value) { return; }
    useToken(value);
    $("token").value = "";
    start(value);
  });

  $("forget").addEventListener("click", function () {
    sessionStorage.removeItem(TOKEN_KEY);
    forgetItem();
    start(null);
  });

  $("buy").addEventListener("click", buy);

  tokenFromFragment();
  showItem();
  start(sessionStorage.getItem(TOKEN_KEY));
})();
