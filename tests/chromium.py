"""The browser the page tests use: Debian's Chromium (`scripts/system-deps` installs it), never a
downloaded one. A missing browser fails the test that needs it; CI installs it."""

from __future__ import annotations

from pathlib import Path

import pytest

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


def chromium_path() -> str:
    # Called from the test, so a missing browser fails it (a fixture would only error it).
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `scripts/system-deps` installs it")
    return str(CHROMIUM)
