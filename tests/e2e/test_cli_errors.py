"""A command that cannot do its work says why in one line and exits 2, changing nothing: a
database with no schema or an older one (a worker and the API refuse to start on it too), a
database or a Redis that does not answer."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from seckill.store.database import open_database
from seckill.store.migrate import upgrade
from tests.conftest import RedisTarget, redis_settings
from tests.support.brokers import free_port
from tests.support.seckill_cli import seckill

pytestmark = [
    pytest.mark.redis_variants("redis7"),
    pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True),  # the fixture's is not used
]


def _tables(path: Path) -> set[str]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}


async def test_a_database_without_the_newest_schema_is_named_with_the_command_that_fixes_it(
    redis_server: RedisTarget, sql_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "shop.db"
    url = f"sqlite+aiosqlite:///{path}"
    run = dict(**redis_settings(redis_server), sql_url=url, data_dir=tmp_path)

    empty = seckill("reconcile", **run)
    assert empty.returncode == 2, empty.stdout + empty.stderr
    assert "the database has no schema: run `seckill db upgrade`" in empty.stdout
    assert "Traceback" not in empty.stdout + empty.stderr
    assert not _tables(path) - {"alembic_version"}  # nothing created behind the operator's back
    # A worker refuses to start on it as well, and the API's supervisor before it forks.
    for process in (("worker", "persister"), ("api", "--workers", "2", "--port", str(free_port()))):
        refused = seckill(*process, **run)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "the database has no schema: run `seckill db upgrade`" in refused.stdout

    database = open_database(url)
    try:
        await upgrade(database, "0005")
    finally:
        await database.dispose()
    older = seckill("item", "list", **run)
    assert older.returncode == 2
    assert "schema is at revision 0005, older than this code's" in older.stdout, older.stdout

    assert seckill("db", "upgrade", **run).returncode == 0
    current = seckill("item", "list", **run)
    assert current.returncode == 0, current.stdout + current.stderr


async def test_a_server_that_does_not_answer_is_named(
    redis_server: RedisTarget, sql_url: str, tmp_path: Path
) -> None:
    closed = free_port()
    redis = redis_settings(redis_server)
    no_database = seckill(
        "reconcile", **redis, sql_url=f"postgresql+asyncpg://seckill@127.0.0.1:{closed}/shop",
        data_dir=tmp_path,
    )  # fmt: skip
    assert no_database.returncode == 2
    assert no_database.stdout.startswith("error: the database did not answer:"), no_database.stdout
    assert "Traceback" not in no_database.stdout + no_database.stderr

    no_redis = seckill(
        "reconcile", redis_url=f"redis://127.0.0.1:{closed}/0", sql_url=sql_url,
        data_dir=tmp_path,
    )  # fmt: skip
    assert no_redis.returncode == 2
    assert no_redis.stdout.startswith("error: Redis did not answer:"), no_redis.stdout
