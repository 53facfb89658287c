"""What every page seckill writes or serves shares: its files in ``static/``, inlined.

The crowd's HTML report and the operator dashboard each are one file with uPlot (vendored in
``static/vendor``) and their own script inside, so they open with no network at all; the pages
the API serves (the dashboard, the console, the buyers' waiting page) share ``page.js`` and are
sent with ``PAGE_HEADERS``.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

# A served page holds everything it needs; it may only call back to where it came from.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
    "style-src 'unsafe-inline'; img-src data:; connect-src 'self'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}


@cache
def static_text(path: str) -> str:
    """A file of the package's ``static/`` directory, e.g. ``vendor/uPlot.min.css``."""
    return (files("seckill") / "static" / path).read_text(encoding="utf-8")


def inline(source: str, tag: str) -> str:
    """``source`` as the body of a ``<tag>`` element."""
    # Nothing inlined holds an end tag today; refuse rather than break a page if one ever does.
    if f"</{tag}" in source.lower():
        raise ValueError(f"cannot inline a source that contains </{tag}")
    return source


def page_fields() -> dict[str, str]:
    """The helpers every served page shares (``page.js``), for its template's ``$page_js``."""
    return {"page_js": inline(static_text("page.js"), "script")}


def uplot_fields() -> dict[str, str]:
    """uPlot's style, licence (a comment) and script, for a page template's fields."""
    return {
        "uplot_css": inline(static_text("vendor/uPlot.min.css"), "style"),
        "uplot_license": inline(static_text("vendor/uPlot.LICENSE").replace("*/", "* /"), "script"),
        "uplot_js": inline(static_text("vendor/uPlot.iife.min.js"), "script"),
    }
