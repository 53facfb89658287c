"""Real redis-servers the tests start, kill and restart on their own: a free port, a client and
engine on one, its AOF copied, restored (a Redis back from older data) and rewritten."""

from __future__ import annotations

import shutil
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from redis.asyncio import BlockingConnectionPool, Redis

from seckill.engine.engine import RedisEngine
from seckill.engine.keys import DEFAULT_PREFIX
from seckill.engine.scripts import Scripts
from seckill.redis_server import RedisServer
from tests.support.polling import wait_until

AOF_FILES = ("appendonlydir", "appendonly.aof")  # Redis 7 keeps a directory, 6.2 one file


@asynccontextmanager
async def connected(server: RedisServer) -> AsyncIterator[tuple[Redis, RedisEngine]]:
    client = Redis.from_pool(BlockingConnectionPool.from_url(server.url, decode_responses=True))
    try:
        yield (
            client,
            RedisEngine(
                client, scripts=Scripts(client), idempotency_ttl_ms=3_600_000, prefix=DEFAULT_PREFIX
            ),
        )
    finally:
        await client.aclose()


def copy_aof(source: Path, target: Path) -> None:
    target.mkdir()
    for name in AOF_FILES:
        if (source / name).is_dir():
            shutil.copytree(source / name, target / name)
        elif (source / name).exists():
            shutil.copy2(source / name, target / name)


def restore_aof(backup: Path, data_dir: Path) -> None:
    for name in AOF_FILES:
        shutil.rmtree(data_dir / name, ignore_errors=True)
        (data_dir / name).unlink(missing_ok=True) if (data_dir / name).is_file() else None
    copy_aof(backup, data_dir / "restored")
    for entry in (data_dir / "restored").iterdir():
        entry.rename(data_dir / entry.name)
    (data_dir / "restored").rmdir()


async def rewrite_aof(redis: Redis) -> None:
    """BGREWRITEAOF, waited for: the rewritten AOF holds every write so far, written and
    fsynced (what everysec would have flushed within a second; no write follows it)."""
    done = int((await redis.info("persistence"))["aof_rewrites"])
    await redis.execute_command("BGREWRITEAOF")

    async def rewritten() -> bool:
        info = await redis.info("persistence")
        return int(info["aof_rewrites"]) > done and not (
            int(info["aof_rewrite_in_progress"]) or int(info["aof_rewrite_scheduled"])
        )

    await wait_until(rewritten, 30, "the AOF rewritten")


def free_port() -> int:
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port != 6379:  # never the machine's own Redis
            return port
