"""Consumer groups of their own on every item stream: each group reads every entry, and trimming
never drops an entry some group has not acknowledged (the persister's and a bridge's side by
side)."""

from __future__ import annotations

import asyncio

import pytest

from seckill.domain.outcomes import ErrorCode, InvalidRequest
from seckill.engine.engine import RedisEngine
from seckill.engine.group_reader import Entry, GroupReader, ReadConfig
from seckill.engine.group_registry import registered_groups
from seckill.engine.keys import items_registry, stream_groups_registry
from seckill.engine.streams import GROUP
from seckill.services.dashboard import take_snapshot
from seckill.services.stream_groups import give_back_groups, list_groups, retire
from seckill.store.ledger import Ledger
from seckill.workers import consumer
from seckill.workers.consumer import as_read, one_pass
from tests.conftest import open_item

pytestmark = pytest.mark.redis_variants("redis7", "cluster")

CONFIG = ReadConfig(batch_size=1000, block_ms=10, poll_ms=10)
ORDERS = 40


def reader(engine: RedisEngine, group: str) -> GroupReader:
    return GroupReader(
        redis=engine.redis, group=group, consumer=f"{group}-1", prefix=engine.prefix, config=CONFIG
    )


async def sell(engine: RedisEngine, orders: int, *, first: int = 1) -> None:
    for n in range(first, first + orders):
        await engine.reserve(1, buyer=f"b{n}", quantity=1, idempotency_key="k", order_id=n)


async def read_all(group: GroupReader) -> list[Entry]:
    await group.upkeep()
    found: list[Entry] = []
    while fresh := await group.read(block=False):
        found += fresh
    return found


async def test_every_group_reads_every_entry(engine: RedisEngine) -> None:
    await engine.load_item(open_item(total=100))
    persister, bridge = reader(engine, GROUP), reader(engine, "bridge-test")
    await persister.upkeep()
    await bridge.upkeep()
    await sell(engine, ORDERS)
    landed, forwarded = await read_all(persister), await read_all(bridge)
    assert [e.entry_id for e in landed] == [e.entry_id for e in forwarded]
    assert len(landed) == ORDERS + 1  # the load, then one reservation each


async def test_trimming_keeps_what_another_group_has_not_acknowledged(
    engine: RedisEngine,
) -> None:
    """Trimming is approximate (whole stream nodes of 100 entries), so a sale of 300 orders:
    what some group still needs always stays, and the rest may go."""
    orders = 300
    await engine.load_item(open_item(total=1000))
    persister, bridge = reader(engine, GROUP), reader(engine, "bridge-test")
    await persister.upkeep()
    await bridge.upkeep()
    await sell(engine, orders)
    stream = engine.keys(1).events

    async def kept() -> list[str]:
        return [entry_id for entry_id, _ in await engine.redis.xrange(stream)]

    await persister.ack(await read_all(persister))  # everything is in SQL
    forwarded = await read_all(bridge)
    await bridge.ack(forwarded[:250])  # the broker confirmed the first 250 only
    await persister.trim()
    left = await kept()
    assert set(e.entry_id for e in forwarded[250:]) <= set(left)
    assert len(left) < orders + 1  # something went: the test can tell

    # A group that has read nothing holds back the whole stream.
    late = reader(engine, "bridge-late")
    await late.discover()
    await bridge.ack(forwarded[250:])
    await persister.trim()
    assert await kept() == left

    await late.ack(await read_all(late))
    await persister.trim()
    assert len(await kept()) < len(left)


@pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)
async def test_the_dashboard_shows_every_other_groups_backlog(
    engine: RedisEngine, ledger: Ledger
) -> None:
    await engine.load_item(open_item(total=100))
    bridge = reader(engine, "bridge-nats")
    await bridge.discover()
    await sell(engine, 10)
    await bridge.ack((await read_all(bridge))[:4])
    (item,) = (await take_snapshot(engine, ledger, [1])).items
    assert item.sinks == {"bridge-nats": 11 - 4}


async def test_the_group_that_acknowledges_last_trims_what_all_have_done_with(
    engine: RedisEngine,
) -> None:
    """Between sweeps a reader trims only the streams it acknowledged in since its last trim:
    whichever group acknowledges last frees the entries; one that acknowledged nothing since
    touches nothing."""
    orders = 300
    quick = ReadConfig(batch_size=1000, block_ms=10, poll_ms=10, trim_every_s=0)
    await engine.load_item(open_item(1, total=1000))
    persister, bridge = (
        GroupReader(
            redis=engine.redis, group=group, consumer=f"{group}-1", prefix=engine.prefix,
            config=quick,
        )
        for group in (GROUP, "bridge-test")
    )  # fmt: skip
    for group in (persister, bridge):
        await group.upkeep()
        await group.trim_if_due()  # the sweep at start
    await sell(engine, orders)
    stream = engine.keys(1).events

    async def length() -> int:
        return int(await engine.redis.xlen(stream))

    await bridge.ack(await read_all(bridge))
    await bridge.trim_if_due()
    assert await length() == orders + 1  # the persister has read none of it
    await persister.ack(await read_all(persister))
    await bridge.trim_if_due()
    assert await length() == orders + 1  # the bridge acknowledged nothing since its trim
    await persister.trim_if_due()
    assert await length() < orders + 1  # the last to acknowledge trims


async def test_a_reader_follows_the_registry_from_before_the_first_entry(
    engine: RedisEngine,
) -> None:
    """An item is registered before it is loaded: a reader's group is made then, with the
    stream, so it has every entry even if another group trims before the reader looks again;
    an item that left the registry (archived) is let go."""
    persister, bridge = reader(engine, GROUP), reader(engine, "bridge-test")
    await engine.redis.sadd(items_registry(engine.prefix), 1)  # loading: registered first
    await persister.discover()
    await bridge.discover()
    await engine.load_item(open_item(total=100))
    await sell(engine, 3)
    landed = await read_all(persister)
    await persister.ack(landed)
    await persister.trim()  # the persister is done with them all

    assert len(await read_all(bridge)) == 4  # the load, then the three reservations
    await engine.redis.srem(items_registry(engine.prefix), 1)
    await bridge.discover()
    assert bridge.streams == {}


async def test_a_reader_that_finds_a_stream_first_makes_every_registered_group(
    engine: RedisEngine,
) -> None:
    """The bridge has registered its group but not yet looked at the new item when the
    persister finds it, lands every entry and trims: the persister made the bridge's group with
    the stream, so the bridge still gets every entry."""
    persister, bridge = reader(engine, GROUP), reader(engine, "bridge-test")
    await bridge.discover()  # registered, before the item exists
    await engine.load_item(open_item(total=1000))
    await sell(engine, 300)
    await persister.ack(await read_all(persister))
    await persister.trim()
    assert len(await read_all(bridge)) == 301  # the load, then every reservation


@pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)
async def test_a_retired_group_leaves_the_registry_and_every_stream(
    engine: RedisEngine, ledger: Ledger
) -> None:
    """Retiring a bridge's group: new streams no longer get it, the streams it was on lose it,
    SQL's registry too (a recovery would make it again), and the persister's trimming no longer
    waits for it. The persister's own group and a group nobody registered are refused, changing
    nothing."""
    persister, bridge = reader(engine, GROUP), reader(engine, "bridge-test")
    for group in (persister, bridge):
        await group.discover()
    await ledger.register_group("bridge-test")  # as a bridge does as it starts
    await ledger.register_group("bridge-test")  # once or more
    await engine.load_item(open_item(total=1000))
    await sell(engine, 300)
    assert await list_groups(engine, ledger) == ["bridge-test", GROUP]

    for wrong in (GROUP, "bridge-typo"):
        with pytest.raises(InvalidRequest) as refused:
            await retire(engine, ledger, wrong)
        assert refused.value.code is ErrorCode.INVALID_GROUP
    assert await list_groups(engine, ledger) == ["bridge-test", GROUP]

    stream = engine.keys(1).events
    await persister.ack(await read_all(persister))
    await persister.trim()
    assert await engine.redis.xlen(stream) == 301  # the bridge has read none of it
    assert await retire(engine, ledger, "bridge-test") == 1
    assert await list_groups(engine, ledger) == [GROUP]
    assert await ledger.stream_groups() == []
    assert [g["name"] for g in await engine.redis.xinfo_groups(stream)] == [GROUP]
    await persister.trim()
    assert await engine.redis.xlen(stream) < 301

    await engine.load_item(open_item(2, total=10))
    await persister.discover()
    groups = await engine.redis.xinfo_groups(engine.keys(2).events)
    assert [g["name"] for g in groups] == [GROUP]


def lots_of(size: int, engine: RedisEngine) -> GroupReader:
    config = ReadConfig(batch_size=size, block_ms=10, poll_ms=10)
    return GroupReader(
        redis=engine.redis, group=GROUP, consumer="ahead-1", prefix=engine.prefix, config=config
    )


async def test_a_backlog_is_read_ahead_while_the_sink_takes_each_lot_in_order(
    engine: RedisEngine,
) -> None:
    """While the sink has one lot, the next is already read and prepared; lots are handled one
    after the other, in stream order, each entry once."""
    await engine.load_item(open_item(total=1000))
    group = lots_of(50, engine)
    await sell(engine, 220)
    everything = [entry_id for entry_id, _ in await engine.redis.xrange(engine.keys(1).events)]
    prepared: list[list[str]] = []
    handled: list[str] = []
    ready_while_handling: list[bool] = []

    def prepare(entries: list[Entry]) -> list[Entry]:
        prepared.append([e.entry_id for e in entries])
        return entries

    async def handle(lot: list[Entry]) -> int:
        if not lot:
            return 0
        await asyncio.sleep(0.02)  # the sink's server at work
        # Prepared by now: the claimed entries (none), each lot so far and the next one.
        ready_while_handling.append(len(prepared) >= len(ready_while_handling) + 3)
        handled.extend(e.entry_id for e in lot)
        await group.ack(lot)
        return len(lot)

    while await one_pass(group, handle, prepare=prepare):
        pass
    assert handled == everything  # 221: the load and each sale, once, in order
    # Each full lot had the next one read and prepared before it was done with.
    assert ready_while_handling == [True, True, True, True, False]  # 50, 50, 50, 50, 21


async def test_a_lot_read_ahead_while_the_sink_stalled_is_read_again_from_redis(
    engine: RedisEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sink that stalls over a lot (an outage) may outlast entries Redis then loses: the lot
    read ahead meanwhile is not handled as read; its entries are read again from Redis, and
    those gone are acknowledged, not handled."""
    monkeypatch.setattr(consumer, "BACKLOG_PASS_S", 0.05)
    await engine.load_item(open_item(total=1000))
    group = lots_of(50, engine)
    await sell(engine, 120)
    stream = engine.keys(1).events
    everything = [entry_id for entry_id, _ in await engine.redis.xrange(stream)]
    lost = everything[50:60]  # in the second lot: read ahead while the first stalls
    handled: list[str] = []
    read: list[list[Entry]] = []
    second_lot_read = asyncio.Event()

    def prepare(entries: list[Entry]) -> list[Entry]:
        read.append(entries)
        if len(read) == 3:  # the claimed entries (none), the first lot, the second
            second_lot_read.set()
        return entries

    async def handle(lot: list[Entry]) -> int:
        if lot and len(read) == 2:  # the first lot, the second not read yet
            async with asyncio.timeout(5):
                await second_lot_read.wait()  # read ahead while the first is handled
            await engine.redis.xdel(stream, *lost)  # then Redis loses some of it
            await asyncio.sleep(0.1)  # and the sink stalls
        handled.extend(e.entry_id for e in lot)
        await group.ack(lot)
        return len(lot)

    while await one_pass(group, handle, prepare=prepare):
        pass
    assert [e.entry_id for e in read[2]][:10] == lost  # read ahead, then lost
    assert handled == [entry_id for entry_id in everything if entry_id not in lost]
    pending = await engine.redis.xpending(stream, GROUP)
    assert pending["pending"] == 0


async def test_a_lot_that_leaves_entries_pending_ends_the_pass_and_they_come_first(
    engine: RedisEngine,
) -> None:
    """A sink not ready for part of a lot (a bridge whose events SQL has not landed yet) leaves
    them pending: the lot read ahead meanwhile is not handled, and the next pass starts with the
    pending entries, so the stream is still handled in its order, each entry once."""
    await engine.load_item(open_item(total=1000))
    group = lots_of(50, engine)
    await sell(engine, 120)
    everything = [entry_id for entry_id, _ in await engine.redis.xrange(engine.keys(1).events)]
    handled: list[str] = []
    took_part = False

    async def handle(lot: list[Entry]) -> int:
        nonlocal took_part
        taken = lot if took_part else lot[:20]  # the first lot: its first 20 only
        took_part = took_part or bool(lot)
        handled.extend(e.entry_id for e in taken)
        await group.ack(taken)
        if len(taken) < len(lot):
            group.read_pending_next()
        return len(taken)

    while await one_pass(group, handle, prepare=as_read):
        pass
    assert handled == everything


async def test_a_pending_entry_deleted_from_its_stream_is_acknowledged_not_handed_on(
    engine: RedisEngine,
) -> None:
    """Read again after Redis failed, an entry Redis lost meanwhile comes back without fields:
    it is acknowledged, and never reaches the sink as an entry of nothing."""
    await engine.load_item(open_item(total=100))
    group = lots_of(50, engine)
    await group.upkeep()
    await sell(engine, 5)
    first = await group.read(block=False)
    stream = engine.keys(1).events
    await engine.redis.xdel(stream, first[1].entry_id, first[2].entry_id)
    group.redis_failed()
    again = await group.read(block=False)
    assert [e.entry_id for e in again] == [
        e.entry_id for i, e in enumerate(first) if i not in (1, 2)
    ]
    assert all(e.fields for e in again)
    assert (await engine.redis.xpending(stream, GROUP))["pending"] == len(again)


@pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)
async def test_the_groups_sql_registered_are_made_again_before_recovery_gives_events_back(
    engine: RedisEngine, ledger: Ledger
) -> None:
    """Redis lost everything, its registry of groups with it: SQL's copy still lists the
    bridge's group, and recovery's ``give_back_groups`` puts it (and the persister's) back in
    the registry and on each of the item's shard streams from the first entry, so the persister
    cannot trim an event given back before the bridge has it."""
    await ledger.register_group("bridge-test")
    await engine.redis.delete(stream_groups_registry(engine.prefix))  # as after FLUSHALL
    assert await list_groups(engine, ledger) == ["bridge-test"]  # SQL's copy

    await give_back_groups(engine, ledger, 7, 2)
    assert await list_groups(engine, ledger) == ["bridge-test", GROUP]
    assert await registered_groups(engine.redis, engine.prefix) == ["bridge-test", GROUP]
    for shard in (0, 1):
        groups = await engine.redis.xinfo_groups(engine.keys(7, shard).events)
        assert {(g["name"], g["last-delivered-id"]) for g in groups} == {
            ("bridge-test", "0-0"),
            (GROUP, "0-0"),
        }
    await give_back_groups(engine, ledger, 7, 2)  # again: nothing changes
