"""An operator lists dead letters and replays them once the cause is fixed."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from redis.asyncio import Redis
from sqlalchemy import insert

from seckill.domain.dead_letters import dead_letter_fields
from seckill.domain.ids import OrderIds
from seckill.domain.items import NewItem
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import DEFAULT_PREFIX
from seckill.engine.streams import stream_drained
from seckill.store.ledger import Ledger
from seckill.store.tables import Inventory, Item
from seckill.workers.persister import Persister, PersisterConfig
from tests.conftest import RedisTarget, new_item, open_item, redis_settings
from tests.support.seckill_cli import seckill


async def restore_item(ledger: Ledger, item_id: int, item: NewItem) -> None:
    """Put back an item row under its old id, as an operator restoring a lost row would."""
    async with ledger.engine.begin() as conn:
        await conn.execute(
            insert(Item).values(
                id=item_id, name=item.name, price_cents=item.price_cents, currency=item.currency,
                total=item.total,
                starts_at=item.starts_at, ends_at=item.ends_at,
                per_buyer_limit=item.per_buyer_limit, hold_seconds=item.hold_seconds,
                created_at=item.starts_at,
            )
        )  # fmt: skip
        await conn.execute(
            insert(Inventory).values(
                item_id=item_id, total=item.total, available=item.total, held=0, sold=0,
                version=0, loaded_position="",
            )
        )  # fmt: skip


@pytest.mark.redis_variants("redis7", "cluster")
async def test_replay_lands_a_dead_letter_once_its_cause_is_fixed(
    redis_server: RedisTarget,
    redis: Redis,
    engine: RedisEngine,
    ledger: Ledger,
    sql_url: str,
    tmp_path: Path,
) -> None:
    # An item put on sale in Redis that SQL does not know: its events cannot land.
    item_id = 900_000 + secrets.randbelow(99_999)
    await engine.load_item(open_item(item_id=item_id, total=5))
    reservation = await engine.reserve(
        item_id, buyer="alice", quantity=1, idempotency_key="k", order_id=OrderIds(8).next()
    )
    assert reservation.order_id
    persister = Persister(
        redis=redis,
        ledger=ledger,
        config=PersisterConfig(max_deliveries=1, block_ms=50),
        prefix=DEFAULT_PREFIX,
    )
    stream = engine.keys(item_id).events
    while not await stream_drained(redis, stream):
        await persister.run_once()
    assert len(await ledger.dead_letters()) == 2  # `loaded` and `reserved`
    run = dict(**redis_settings(redis_server), sql_url=sql_url, data_dir=tmp_path)

    listed = seckill("dead-letters", "list", **run)
    assert listed.returncode == 0, listed.stderr
    assert "items SQL does not know" in listed.stdout

    refused = seckill("dead-letters", "replay", **run)
    assert refused.returncode == 1
    assert "still cannot land" in refused.stdout
    assert await ledger.orders(item_id) == {}

    await restore_item(ledger, item_id, new_item(total=5))  # the operator's fix
    replayed = seckill("dead-letters", "replay", **run)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert list(await ledger.orders(item_id)) == [reservation.order_id]
    assert await ledger.dead_letters() == []
    assert len(await ledger.dead_letters(include_settled=True)) == 2
    again = seckill("dead-letters", "replay", "1", **run)  # replayed already: not pending
    assert again.returncode == 1
    assert "no pending dead letter" in again.stdout


@pytest.mark.redis_variants("redis7")
async def test_a_bridge_letter_waits_for_a_broker_and_either_kind_can_be_dropped(
    redis_server: RedisTarget,
    redis: Redis,
    engine: RedisEngine,
    ledger: Ledger,
    sql_url: str,
    tmp_path: Path,
) -> None:
    item_id = 900_000 + secrets.randbelow(99_999)
    await engine.load_item(open_item(item_id=item_id, total=5))
    await engine.reserve(
        item_id, buyer="alice", quantity=1, idempotency_key="k", order_id=OrderIds(8).next()
    )
    keys = engine.keys(item_id)
    [(entry_id, fields)] = [e for e in await engine.events(item_id) if e[1]["event"] == "reserved"]
    # What a bridge to RabbitMQ writes once the broker refused the entry five times.
    dead_id = await redis.xadd(
        keys.dead_letters,
        dead_letter_fields(
            fields, entry_id=entry_id, group="bridge-rabbitmq", error="full", deliveries=5
        ),
    )
    await ledger.add_dead_letter(
        stream=keys.events, entry_id="1-1", payload={"event": "nonsense"}, error="bad",
        deliveries=5,
    )  # fmt: skip
    [persisters] = await ledger.dead_letters()
    bridge_letter = f"{item_id}:0:{dead_id}"
    run = dict(**redis_settings(redis_server), sql_url=sql_url, data_dir=tmp_path)

    listed = seckill("dead-letters", "list", "--group", "bridge-rabbitmq", **run)
    assert listed.returncode == 0, listed.stderr
    assert bridge_letter in listed.stdout and "full" in listed.stdout
    assert "nonsense" not in listed.stdout and "bad" not in listed.stdout

    # No broker named: the letter stays where it is.
    refused = seckill("dead-letters", "replay", bridge_letter, **run)
    assert refused.returncode == 1
    assert "no broker to deliver to" in refused.stdout
    assert await redis.xlen(keys.dead_letters) == 1
    wrong = seckill("dead-letters", "replay", "--to", "nats://127.0.0.1:1", bridge_letter, **run)
    assert wrong.returncode == 1
    assert "a letter of bridge-rabbitmq, and the broker given is nats" in wrong.stdout

    dropped = seckill("dead-letters", "drop", bridge_letter, persisters.id, **run)
    assert dropped.returncode == 0, dropped.stdout + dropped.stderr
    assert await redis.xlen(keys.dead_letters) == 0
    assert await ledger.dead_letters() == []
    [kept] = await ledger.dead_letters(include_settled=True)
    assert kept.dropped_at is not None and kept.replayed_at is None
    everything = seckill("dead-letters", "list", "--all", **run)
    assert "dropped" in everything.stdout and bridge_letter not in everything.stdout

    again = seckill("dead-letters", "drop", bridge_letter, "x", **run)
    assert again.returncode == 1
    assert f"{bridge_letter}: no pending dead letter" in again.stdout
    assert "x: no pending dead letter" in again.stdout
