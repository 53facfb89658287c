from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from seckill.cli.settings import masked
from seckill.config import Settings
from seckill.domain.masking import mask_in, mask_url


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


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://10.0.0.5:6379/0?password=hunter2&db=1", "redis://10.0.0.5:6379/0?password=***&db=1"),
        ("rediss://default:hunter2@cache:6380/0", "rediss://default:***@cache:6380/0"),
        ("nats://s3cret-token@nats:4222", "nats://***@nats:4222"),
        ("amqps://shop:hunter2@mq:5671/%2F", "amqps://shop:***@mq:5671/%2F"),
        ("https://idp:hunter2@id.example/jwks.json", "https://idp:***@id.example/jwks.json"),
        ("postgresql+asyncpg://u:hunter2@db:5432/s?ssl=require", "postgresql+asyncpg://u:***@db:5432/s?ssl=require"),
        ("mysql+asyncmy://u@db/s?auth_token=hunter2", "mysql+asyncmy://***@db/s?auth_token=***"),
        ("sqlite+aiosqlite:///.seckill/seckill.db", "sqlite+aiosqlite:///.seckill/seckill.db"),
        ("redis://[::1:6379/0?password=hunter2", "redis://***"),  # unparsable: hidden whole
    ],
)  # fmt: skip
def test_one_rule_masks_every_credential_a_url_may_hold(url: str, shown: str) -> None:
    assert mask_url(url) == shown
    assert masked("jwt_jwks_url", url) == shown  # every *_url setting, secret-listed or not


def test_a_driver_error_quoting_a_url_is_masked() -> None:
    url = "https://idp:hunter2@id.example/jwks.json?token=abcdef"
    said = f"cannot reach {url}: hunter2 refused, token abcdef"
    assert mask_in(said, url) == (
        "cannot reach https://idp:***@id.example/jwks.json?token=***: *** refused, token ***"
    )
