"""What every benchmark shares: a private redis-server on a free port, and the JSON last line."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from seckill.redis_server import RedisServer, bundled_redis_server

Measure = Callable[[RedisServer, argparse.Namespace], Awaitable[dict[str, Any]]]


def run_on_private_redis(measure: Measure, args: argparse.Namespace) -> None:
    """Start a throwaway redis-server, measure, and print the figures as the last line."""
    with RedisServer(binary=redis_binary(args.redis_server), port=free_port()) as server:
        result = asyncio.run(measure(server, args))
    print(json.dumps(result))


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
