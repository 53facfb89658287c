"""What every benchmark shares: which redis-server to run and a free port to run it on."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

from seckill.redis_server import bundled_redis_server


def redis_binary(given: str | None) -> Path:
    """The redis-server asked for, else the one on PATH, else the bundled 6.2."""
    found = given or shutil.which("redis-server")
    return Path(found) if found else bundled_redis_server()


def free_port() -> int:
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port != 6379:  # never the machine's own Redis, not even by chance
            return port
