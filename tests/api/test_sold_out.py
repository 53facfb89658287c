"""Protecting Redis from a crowd: the per-process sold-out flag and the per-buyer rate limit.

The flag is counted from the server's own statistics (INFO commandstats): after a sell-out, a
stampede of purchases costs Redis no script call at all until the flag runs out (one GET of each
request's idempotency record, so a repeat of a reservation keeps its answer), tickets and item
reads no command at all, and stock that comes back is sold again within
``sold_out_recheck_ms``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from seckill.domain.ids import OrderIds
from seckill.domain.outcomes import Outcome
from seckill.engine.engine import RedisEngine
from seckill.security.tickets import TicketCodec
from seckill.services.item_cache import ItemCache
from seckill.services.items import item_on_sale
from seckill.services.purchases import Purchases
from seckill.services.sold_out import SoldOut, SoldOutFlags
from seckill.services.tickets import TicketOffice
from seckill.store.ledger import Ledger
from tests.api.conftest import Api, api_settings, running_api
from tests.conftest import RedisTarget, new_item, open_item, redis_settings

single_redis = pytest.mark.redis_variants("redis7")
sqlite_only = pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)

STAMPEDE = 200
RECHECK_MS = 300


@contextlib.asynccontextmanager
async def live_api(
    redis_server: RedisTarget, sql_url: str, tmp_path: Path, **more: Any
) -> AsyncIterator[Api]:
    settings = api_settings(
        **redis_settings(redis_server), database_url=sql_url, data_dir=tmp_path, **more
    )
    async with running_api(settings) as api:
        yield api


async def evalsha_calls(redis: Redis) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def commands_run(redis: Redis) -> int:
    """Every command the server has run, the INFO that asks left out."""
    stats = await redis.info("commandstats")
    return sum(int(s["calls"]) for name, s in stats.items() if name != "cmdstat_info")


async def sell_out(api: Api, item_id: int) -> None:
    """The one unit goes to the holder; the next buyer hears sold_out from Redis itself."""
    assert (await api.buy(item_id, "holder", "holder-key")).status_code == 202
    await api.ticket(item_id, "first-loser")  # a ticket's read of the item is a script too
    before = await evalsha_calls(api.runtime.redis)
    seen = await api.buy(item_id, "first-loser", "k")
    assert (seen.status_code, seen.json()["error"]) == (409, "sold_out")
    assert await evalsha_calls(api.runtime.redis) == before + 1  # that answer came from Redis


@single_redis
@sqlite_only
async def test_after_a_sell_out_a_stampede_makes_no_script_call(
    redis_server: RedisTarget, redis: Redis, ledger: Ledger, sql_url: str, tmp_path: Path
) -> None:
    recheck_ms = 30_000  # the stampede must fit in the window however slow the machine
    async with live_api(redis_server, sql_url, tmp_path, sold_out_recheck_ms=recheck_ms) as api:
        item_id = await api.create_item(total=1)
        # The crowd took its tickets first (each a read of the item, one script): once the flag
        # stands none is issued.
        await asyncio.gather(*(api.ticket(item_id, f"crowd-{n}") for n in range(STAMPEDE)))
        await sell_out(api, item_id)
        flagged_at = time.monotonic()
        before = await evalsha_calls(redis)
        answers = await asyncio.gather(
            *(api.buy(item_id, f"crowd-{n}", f"k-{n}") for n in range(STAMPEDE))
        )
        assert time.monotonic() - flagged_at < recheck_ms / 1000
        assert Counter((a.status_code, a.json()["error"]) for a in answers) == {
            (409, "sold_out"): STAMPEDE
        }
        assert await evalsha_calls(redis) == before
        stock = await api.runtime.engine.stock(item_id)
        assert stock is not None and (stock.available, stock.held) == (0, 1)


@single_redis
@sqlite_only
async def test_after_a_sell_out_tickets_and_item_reads_make_no_redis_call(
    redis_server: RedisTarget, redis: Redis, ledger: Ledger, sql_url: str, tmp_path: Path
) -> None:
    # No worker-id lease to renew and the item's record in memory throughout: nothing else
    # in the process sends Redis a command while the requests below are answered.
    async with live_api(
        redis_server,
        sql_url,
        tmp_path,
        sold_out_recheck_ms=30_000,
        worker_id=1,
        item_cache_local_seconds=3_600,
    ) as api:
        item_id = await api.create_item(total=1)
        assert (await api.http.get(f"/api/v1/items/{item_id}")).json()["available"] == 1
        await sell_out(api, item_id)
        refused = await api.buy(item_id, "first-loser", "k")  # the purchase's refusal, flagged
        before = await commands_run(redis)
        tickets = await asyncio.gather(
            *(api.issue_ticket(item_id, f"crowd-{n}") for n in range(STAMPEDE))
        )
        reads = await asyncio.gather(
            *(api.http.get(f"/api/v1/items/{item_id}") for _ in range(STAMPEDE))
        )
        assert await commands_run(redis) == before
        # A ticket is refused with the purchase's own answer; a read shows nothing left.
        assert Counter((t.status_code, t.body) for t in tickets) == {(409, refused.body): STAMPEDE}
        assert refused.json() == {"error": "sold_out", "message": "sold out"}
        assert Counter((r.status_code, r.json()["available"]) for r in reads) == {
            (200, 0): STAMPEDE
        }
        stock = await api.runtime.engine.stock(item_id)  # the refusals changed nothing
        assert stock is not None and (stock.available, stock.held) == (0, 1)


@single_redis
@sqlite_only
async def test_while_flagged_a_repeat_of_a_reservation_still_gets_its_first_answer(
    redis_server: RedisTarget, redis: Redis, ledger: Ledger, sql_url: str, tmp_path: Path
) -> None:
    async with live_api(redis_server, sql_url, tmp_path, sold_out_recheck_ms=30_000) as api:
        item_id = await api.create_item(total=1)
        first = await api.buy(item_id, "holder", "holder-key")
        assert first.status_code == 202
        assert (await api.buy(item_id, "first-loser", "k")).json()["error"] == "sold_out"
        before = await evalsha_calls(redis)
        again = await api.buy(item_id, "holder", "holder-key")  # flag up: one GET, no script
        assert (again.status_code, again.body) == (202, first.body)
        other_body = await api.buy(item_id, "holder", "holder-key", quantity=2)
        assert other_body.status_code in {422}  # key_reused or quantity above the limit
        assert await evalsha_calls(redis) == before


@single_redis
@sqlite_only
async def test_a_released_unit_is_sold_again_after_the_flag_runs_out(
    redis_server: RedisTarget, redis: Redis, ledger: Ledger, sql_url: str, tmp_path: Path
) -> None:
    async with live_api(redis_server, sql_url, tmp_path, sold_out_recheck_ms=RECHECK_MS) as api:
        item_id = await api.create_item(total=1)
        holder = await api.buy(item_id, "holder", "k")
        assert holder.status_code == 202
        asked_at = time.monotonic()  # the flag is armed after this, so it stands until
        seen = await api.buy(item_id, "first-loser", "k")  # at least asked_at + the interval
        assert (seen.status_code, seen.json()["error"]) == (409, "sold_out")

        cancel = await api.http.post(
            f"/api/v1/items/{item_id}/orders/{holder.json()['order_id']}/cancel",
            headers=api.as_buyer("holder"),
        )
        assert cancel.status_code == 200, cancel.text

        answers: list[tuple[float, int]] = []  # (answered at, status)
        for n in range(1_000):
            answer = await api.buy(item_id, f"retry-{n}", "k")
            answers.append((time.monotonic(), answer.status_code))
            if answer.status_code == 202:
                break
            assert answer.json()["error"] == "sold_out", answer.text
            await asyncio.sleep(0.01)
        # Sold again once the flag ran out (by when exactly: the moved clock's tests below).
        assert answers[-1][1] == 202, "the released unit was never sold again"
        # The flag did answer in between (stale, as it may be): a request answered before it
        # could have run out was refused, though the unit was back.
        stale = [status for at, status in answers if at < asked_at + RECHECK_MS / 1000]
        assert stale and set(stale) == {409}
        stock = await api.runtime.engine.stock(item_id)
        assert stock is not None and (stock.available, stock.held) == (0, 1)


@single_redis
@sqlite_only
async def test_a_buyer_over_the_rate_limit_gets_429_with_retry_after(
    redis_server: RedisTarget, redis: Redis, ledger: Ledger, sql_url: str, tmp_path: Path
) -> None:
    window_s = 60  # long in real time, so the attempts below all fall in one window
    async with live_api(
        redis_server,
        sql_url,
        tmp_path,
        rate_limit_requests=3,
        rate_limit_window_seconds=window_s,
    ) as api:
        item_id = await api.create_item(total=100, limit=1)
        statuses = [(await api.buy(item_id, "eager", f"k-{n}")).status_code for n in range(3)]
        assert statuses == [202, 409, 409]  # then limit_reached: refusals count as attempts
        again = await api.buy(item_id, "eager", "k-0")  # a replay is answered, uncounted
        assert again.status_code == 202
        limited = await api.buy(item_id, "eager", "k-3")
        assert (limited.status_code, limited.json()["error"]) == (429, "rate_limited")
        assert 1 <= int(limited.headers["Retry-After"]) <= window_s
        other = await api.buy(item_id, "calm", "k-0")
        assert other.status_code == 202
        stock = await api.runtime.engine.stock(item_id)
        assert stock is not None and stock.held == 2


# The flag's rules on the service itself, on a real Redis, with a clock the test moves.


class SecondsClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


async def test_the_flag_arms_on_sold_out_only_and_runs_out(engine: RedisEngine) -> None:
    clock = SecondsClock()
    purchases = Purchases(engine, OrderIds(6), sold_out=SoldOutFlags(500, clock=clock))
    await engine.load_item(open_item(total=2, limit=2))

    async def buy(buyer: str, quantity: int = 1) -> Outcome:
        answer = await purchases.buy(1, buyer=buyer, quantity=quantity, idempotency_key=buyer)
        return answer.outcome

    assert await buy("a") is Outcome.RESERVED
    assert await buy("b", 2) is Outcome.INSUFFICIENT_STOCK  # units are left: no flag
    assert await buy("c") is Outcome.RESERVED
    assert await buy("d") is Outcome.SOLD_OUT  # from Redis: arms the flag
    holds = await engine.holds(1)
    await engine.release(1, next(iter(holds)), "cancelled")  # type: ignore[arg-type]
    clock.now += 0.499
    assert await buy("e") is Outcome.SOLD_OUT  # the flag, stale within its interval
    clock.now += 0.001
    assert await buy("e") is Outcome.RESERVED  # ran out: Redis again, which sells
    assert await buy("f") is Outcome.SOLD_OUT  # re-armed
    assert len(await engine.holds(1)) == 3  # the flag's answers reserved nothing


async def test_without_a_recheck_interval_every_request_asks_redis(
    engine: RedisEngine,
) -> None:
    purchases = Purchases(engine, OrderIds(6))
    await engine.load_item(open_item(total=1))
    reserved = await purchases.buy(1, buyer="a", quantity=1, idempotency_key="k")
    assert reserved.order_id
    assert (await purchases.buy(1, buyer="b", quantity=1, idempotency_key="k")).outcome is (
        Outcome.SOLD_OUT
    )
    await engine.release(1, reserved.order_id, "cancelled")  # type: ignore[arg-type]
    assert (await purchases.buy(1, buyer="b", quantity=1, idempotency_key="k")).accepted


@single_redis
@sqlite_only
async def test_tickets_and_item_reads_follow_the_flag_and_a_unit_that_comes_back_sells(
    engine: RedisEngine, redis: Redis, ledger: Ledger
) -> None:
    clock = SecondsClock()
    flags = SoldOutFlags(500, clock=clock)  # one for the three paths, as a process has
    purchases = Purchases(engine, OrderIds(6), sold_out=flags)
    tickets = TicketOffice(
        engine=engine,
        codec=TicketCodec("flag-test-secret-" + "t" * 32),
        sold_out=flags,
        ttl_ms=60_000,
        lead_ms=0,
    )
    cache = ItemCache(
        engine=engine, source=ledger, local_seconds=3_600, redis_seconds=60,
        jitter_seconds=0, absent_seconds=60, sale_lead_seconds=60,
    )  # fmt: skip
    record = await ledger.item(await ledger.create_item(new_item(total=1)))
    assert record is not None
    item_id = record.item_id
    await engine.load_item(record.sale_item())

    async def buy(buyer: str) -> Outcome:
        await tickets.issue(item_id, buyer=buyer)
        answer = await purchases.buy(item_id, buyer=buyer, quantity=1, idempotency_key=buyer)
        return answer.outcome

    async def available() -> int | None:
        return (await item_on_sale(cache, item_id, ledger=ledger, sold_out=flags)).available

    assert await available() == 1  # the record in memory from here on
    assert await buy("a") is Outcome.RESERVED
    assert await available() == 0  # read live: no flag yet
    assert await buy("b") is Outcome.SOLD_OUT  # from Redis: arms the flag
    before = await commands_run(redis)
    with pytest.raises(SoldOut):
        await tickets.issue(item_id, buyer="c")
    assert await available() == 0
    assert await commands_run(redis) == before

    holds = await engine.holds(item_id)
    await engine.release(item_id, next(iter(holds)), "cancelled")  # type: ignore[arg-type]
    clock.now += 0.499
    with pytest.raises(SoldOut):  # the flag, stale within its interval
        await tickets.issue(item_id, buyer="c")
    assert await available() == 0
    clock.now += 0.001
    assert await available() == 1  # ran out: read live again
    assert await buy("c") is Outcome.RESERVED  # a ticket again, and the unit
    stock = await engine.stock(item_id)
    assert stock is not None and (stock.available, stock.held) == (0, 1)
