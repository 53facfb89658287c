// What every page seckill serves shares (inlined before the page's own script): a few DOM
// helpers, and a token taken out of the address.
var seckillPage = (function () {
  "use strict";

  function $(id) { return document.getElementById(id); }

  function setText(el, value) {
    var text = value == null ? "-" : String(value);
    if (el.textContent !== text) { el.textContent = text; }
  }

  // The page's status line (#status): a message, and its state for the style (info, error...).
  function status(message, state) {
    var el = $("status");
    el.textContent = message || "";
    el.dataset.state = message ? state || "" : "";
  }

  // A link may carry a token in its fragment (#token=...), which browsers never send to the
  // server: the token, taken out of the address bar, the history and any bookmark; else null.
  function fragmentToken() {
    var match = /(?:^|&)token=([^&]+)/.exec(location.hash.slice(1));
    if (!match) { return null; }
    history.replaceState(null, "", location.pathname + location.search);
    return decodeURIComponent(match[1]);
  }

  // The admin pages' token (the dashboard's and the console's: one, kept in this tab), from
  // the address, the tab, or the #login form (#token, its submit button, #forget). ``use`` is
  // called with it whenever it changes, null when there is none (the form shows; ``use`` says
  // what to enter). Returns what the page calls when the server refuses it (401, 403): it is
  // forgotten, and why is said.
  function adminToken(use) {
    var KEY = "seckill.admin.token";
    var login = $("login");

    function change(token) {
      if (token) { sessionStorage.setItem(KEY, token); } else { sessionStorage.removeItem(KEY); }
      $("token").hidden = login.querySelector("label").hidden = !!token;
      login.querySelector("button[type=submit]").hidden = !!token;
      use(token);
    }

    login.addEventListener("submit", function (event) {
      event.preventDefault();
      var value = $("token").value.trim();
      if (!value) { return; }
      $("token").value = "";
      change(value);
    });
    $("forget").addEventListener("click", function () { change(null); });
    change(fragmentToken() || sessionStorage.getItem(KEY));

    return function refused(code, body) {
      change(null);
      var detail = body && body.message ? " (" + body.message + ")" : "";
      status(code === 401
        ? "The token was refused: it is invalid or expired" + detail + ". Enter an admin token."
        : "This token is not an admin's" + detail + ". Enter an admin token.", "error");
    };
  }

  // A sum in minor units of an ISO 4217 currency, in its own decimals: "19.99 EUR", "1999 JPY".
  function money(cents, currency) {
    var digits = new Intl.NumberFormat("en", { style: "currency", currency: currency })
      .resolvedOptions().maximumFractionDigits;
    return (cents / Math.pow(10, digits)).toFixed(digits) + " " + currency;
  }

  return {
    $: $, setText: setText, status: status, fragmentToken: fragmentToken, adminToken: adminToken,
    money: money,
  };
})();
