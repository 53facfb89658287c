from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from seckill.config import Settings


def test_settings_read_the_seckill_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECKILL_REDIS_URL", "redis://127.0.0.1:6390/0")
    monkeypatch.setenv("SECKILL_HOLD_SECONDS", "90")
    monkeypatch.setenv("SECKILL_DATA_DIR", "/tmp/sk")
    settings = Settings()
    assert settings.redis_url == "redis://127.0.0.1:6390/0"
    assert settings.hold_seconds == 90
    assert (
        settings.effective_database_url == f"sqlite+aiosqlite:///{Path('/tmp/sk') / 'seckill.db'}"
    )
    assert settings.database_url_is_default


def test_bad_settings_are_refused_with_the_field_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECKILL_HOLD_SECONDS", "soon")
    with pytest.raises(ValidationError, match="hold_seconds"):
        Settings()


def test_importing_the_package_creates_nothing() -> None:
    # A Redis URL that cannot work and a setting that cannot parse: importing must not care.
    code = (
        "import pkgutil, importlib, seckill\n"
        "for m in pkgutil.walk_packages(seckill.__path__, 'seckill.'):\n"
        "    importlib.import_module(m.name)\n"
        "import threading, multiprocessing\n"
        "assert threading.active_count() == 1, threading.enumerate()\n"
        "assert not multiprocessing.active_children()\n"
    )
    env = {"SECKILL_REDIS_URL": "redis://0.0.0.0:1/0", "SECKILL_HOLD_SECONDS": "x", "PATH": ""}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)
