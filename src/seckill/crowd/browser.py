"""The browser that looks at seckill's pages: Debian's Chromium (``scripts/system-deps`` installs
it), driven headless by Playwright (a development dependency), never a downloaded one."""

from __future__ import annotations

import importlib.util
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
# Headless as root on a closed network: without the last four Chromium keeps calling home.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def browser_missing() -> str | None:
    """Why no page can be looked at here, or None when Chromium and Playwright are both here."""
    if importlib.util.find_spec("playwright") is None:
        return "Playwright is not installed (pip install -e '.[dev]')"
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing (scripts/system-deps installs it)"
    return None
