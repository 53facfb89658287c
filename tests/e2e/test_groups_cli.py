"""An operator retires a bridge taken out of service: its group leaves the registry (Redis's and
SQL's) and every item stream; the persister's group, or a name nobody registered, is refused and
nothing changes."""

from __future__ import annotations

from pathlib import Path

import pytest

from seckill.engine.engine import RedisEngine
from seckill.engine.group_reader import GroupReader, ReadConfig
from seckill.engine.streams import GROUP
from seckill.store.ledger import Ledger
from tests.conftest import RedisTarget, open_item, redis_settings
from tests.support.seckill_cli import seckill


@pytest.mark.redis_variants("redis7")
@pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)  # the groups' durable copy
async def test_an_operator_retires_a_bridges_group(
    redis_server: RedisTarget, engine: RedisEngine, ledger: Ledger, sql_url: str, tmp_path: Path
) -> None:
    await engine.load_item(open_item(total=5))
    for group in (GROUP, "bridge-nats"):
        reader = GroupReader(
            redis=engine.redis, group=group, consumer="c", prefix=engine.prefix,
            config=ReadConfig(),
        )  # fmt: skip
        await reader.discover()
    await ledger.register_group("bridge-nats")  # as the bridge does as it starts
    run = dict(**redis_settings(redis_server), sql_url=sql_url, data_dir=tmp_path)
    stream = engine.keys(1).events

    assert seckill("groups", "list", **run).stdout.split() == ["bridge-nats", GROUP]
    for wrong in (GROUP, "bridge-typo"):
        refused = seckill("groups", "retire", wrong, **run)
        assert refused.returncode == 2 and "invalid_group" in refused.stdout, refused.stdout
    assert len(await engine.redis.xinfo_groups(stream)) == 2

    retired = seckill("groups", "retire", "bridge-nats", **run)
    assert retired.returncode == 0, retired.stdout + retired.stderr
    assert "it left 1 item streams" in retired.stdout
    assert seckill("groups", "list", **run).stdout.split() == [GROUP]
    assert [g["name"] for g in await engine.redis.xinfo_groups(stream)] == [GROUP]
    assert await ledger.stream_groups() == []
