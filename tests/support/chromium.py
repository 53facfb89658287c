"""The browser the page tests use: ``seckill.crowd.browser``'s. A missing browser fails the test
that needs it; CI installs it."""

from __future__ import annotations

import pytest

from seckill.crowd.browser import CHROMIUM, CHROMIUM_ARGS

__all__ = ["CHROMIUM_ARGS", "chromium_path"]


def chromium_path() -> str:
    # Called from the test, so a missing browser fails it (a fixture would only error it).
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `scripts/system-deps` installs it")
    return str(CHROMIUM)
