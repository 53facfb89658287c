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

  return { $: $, setText: setText, status: status, fragmentToken: fragmentToken };
})();
