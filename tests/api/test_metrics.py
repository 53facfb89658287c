"""``GET /metrics``: what a known load leaves in the counters, scraped from a live API over real
Redis and SQL; and several processes sharing one metrics directory, summed by any API process.

The registry is process-wide and other tests run in this process too: every assertion compares
a scrape taken before the load with one taken after.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis
from starlette.types import Receive, Scope, Send

from benchmarks.baselines import AdmissionLimit
from seckill.api.metrics import HttpMetrics
from seckill.api.paths import PURCHASE_ROUTE
from seckill.bootstrap.keys import token_codec
from seckill.bootstrap.workers import WorkerKind, build_worker
from seckill.config import Settings
from seckill.engine.keys import DEFAULT_PREFIX, item_keys
from seckill.observability import metrics
from seckill.redis_cluster import LocalCluster
from seckill.security.tickets import TICKET_HEADER
from seckill.security.tokens import Role
from seckill.services.reconcile.drift import Drift
from seckill.store.ledger import Ledger
from tests.api.conftest import JWT_SECRET, PAYMENT_SECRET, Answer, Api, api_settings, running_api
from tests.api.test_admission import call, status
from tests.conftest import RedisTarget, redis7_binary, redis_settings

single_redis = pytest.mark.redis_variants("redis7")
sqlite_only = pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)

TICKETS_ROUTE = "/api/v1/items/{item_id}/tickets"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """A sample's value; 0 when absent (a labelled counter not touched yet)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def by_label(samples: Samples, name: str, label: str, **fixed: str) -> dict[str, float]:
    """``{label value: sample value}`` for the samples of ``name`` that have ``fixed`` labels."""
    found = {}
    for (sample, labels), v in samples.items():
        seen = dict(labels)
        if sample == name and all(seen.get(k) == w for k, w in fixed.items()) and label in seen:
            found[seen[label]] = v
    return found


def outcomes(before: Samples, after: Samples, route: str) -> Counter[str]:
    """How many requests of ``route`` were counted per outcome between the two scrapes."""
    name = "seckill_http_requests_total"
    grown = by_label(after, name, "outcome", route=route)
    was = by_label(before, name, "outcome", route=route)
    return Counter({k: int(v - was.get(k, 0)) for k, v in grown.items() if v != was.get(k, 0)})


def outcome_of(route: str, answer: Answer) -> str:
    if answer.status_code >= 400:
        return str(answer.json()["error"])
    return "reserved" if route == PURCHASE_ROUTE else str(answer.status_code)


async def scrape(api: Api) -> Samples:
    answer = await api.http.get("/metrics")
    assert answer.status_code == 200, answer.text
    assert answer.headers["Content-Type"].startswith("text/plain; version=")
    return parse(answer.text)


@pytest.fixture
async def metered(
    redis_server: RedisTarget, redis: Redis, ledger: Ledger, sql_url: str, tmp_path: Path
) -> AsyncIterator[Api]:
    """The API with its persister and reaper; windows long enough for any machine's pace."""
    settings = api_settings(
        **redis_settings(redis_server),
        database_url=sql_url,
        data_dir=tmp_path,
        reaper_interval_seconds=0.05,
        sold_out_recheck_ms=60_000,
        rate_limit_window_seconds=60,
        ticket_ttl_seconds=600,
    )
    async with running_api(settings, workers=(WorkerKind.PERSISTER, WorkerKind.REAPER)) as live:
        yield live


@sqlite_only
@pytest.mark.redis_variants("redis6.2", "redis7", "cluster")
async def test_counters_equal_what_was_sent(metered: Api) -> None:
    api = metered
    started = time.time()
    before = await scrape(api)
    sent: dict[str, Counter[str]] = {PURCHASE_ROUTE: Counter(), TICKETS_ROUTE: Counter()}

    def count(answer: Answer) -> Answer:
        sent[PURCHASE_ROUTE][outcome_of(PURCHASE_ROUTE, answer)] += 1
        return answer

    # 5 units, 8 buyers once each (their tickets taken first: none is issued once the flag
    # stands); a late buyer's ticket then; one greedy buyer past the rate limit (5 attempts).
    scarce = await api.create_item(total=5)
    for n in range(8):
        await api.ticket(scarce, f"buyer-{n}")
    for n in range(8):
        count(await api.buy(scarce, f"buyer-{n}", f"k-{n}"))
    late = await api.issue_ticket(scarce, "late")
    assert (late.status_code, late.json()["error"]) == (409, "sold_out")
    plenty = await api.create_item(total=100)
    await api.ticket(plenty, "greedy")
    for n in range(6):
        count(await api.buy(plenty, "greedy", f"greedy-{n}"))
    sent[TICKETS_ROUTE].update({"200": 9, "sold_out": 1})
    anonymous = await api.http.post(
        f"/api/v1/items/{scarce}/orders", headers={"Idempotency-Key": "x"}, json={}
    )
    count(anonymous)
    nowhere = await api.http.get("/no/such/path")

    assert sent[PURCHASE_ROUTE] == {
        "reserved": 6, "sold_out": 3, "limit_reached": 4, "rate_limited": 1, "invalid_token": 1
    }  # fmt: skip
    after = await scrape(api)
    for route, expected in sent.items():
        assert outcomes(before, after, route) == expected, route
    assert outcomes(before, after, "other") == {nowhere.json()["error"]: 1}
    duration = "seckill_http_request_duration_seconds_count"
    assert value(after, duration, route=PURCHASE_ROUTE) - value(
        before, duration, route=PURCHASE_ROUTE
    ) == sum(sent[PURCHASE_ROUTE].values())

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("seckill_rate_limited_total") == 1
    assert grew("seckill_shed_total") == 0
    # The first sold_out came from the script; the flag answered the two after it, and the
    # late ticket.
    assert grew("seckill_sold_out_flag_hits_total", request="purchase") == 2
    assert grew("seckill_sold_out_flag_hits_total", request="ticket") == 1
    # Every script run: 6 holds, 1 sold_out, 4 limit_reached, 1 rate_limited.
    assert grew("seckill_redis_script_duration_seconds_count", script="reserve") == 12
    assert grew("seckill_redis_script_duration_seconds_count", script="load_item") == 2
    assert grew("seckill_redis_script_duration_seconds_sum", script="reserve") > 0

    # Item reads alone: each is counted once in memory, and a memory miss leads to one load at
    # most (readers may share one), which is a hit or a miss in Redis.
    reads_before = after
    for _ in range(3):
        read = await api.http.get(f"/api/v1/items/{scarce}")
        assert (read.status_code, read.json()["available"]) == (200, 0)
    reads_after = await scrape(api)
    assert outcomes(reads_before, reads_after, "/api/v1/items/{item_id}") == {"200": 3}
    # Sold out: the flag answered them (the record still comes through the cache).
    flagged = value(reads_after, "seckill_sold_out_flag_hits_total", request="item")
    assert flagged - value(reads_before, "seckill_sold_out_flag_hits_total", request="item") == 3
    lookups = {
        (tier, result): value(reads_after, "seckill_item_cache_lookups_total", tier=tier,
                              result=result)
        - value(reads_before, "seckill_item_cache_lookups_total", tier=tier, result=result)
        for tier in ("memory", "redis")
        for result in ("hit", "miss")
    }  # fmt: skip
    assert lookups["memory", "hit"] + lookups["memory", "miss"] == 3
    assert lookups["redis", "hit"] + lookups["redis", "miss"] <= lookups["memory", "miss"]

    # Once the persister drained: nothing pending or unread, every event counted once.
    give_up = time.monotonic() + 10
    while True:
        after = await scrape(api)
        groups = [(str(i), "persister") for i in (scarce, plenty)]
        # (gauges of these item ids may be left from an earlier test: the events say when)
        if grew("seckill_persister_rows_total") >= 8 and all(
            value(after, "seckill_stream_pending", item=i, group=g) == 0
            and value(after, "seckill_stream_lag", item=i, group=g) == 0
            and ("seckill_stream_pending", frozenset({("item", i), ("group", g)})) in after
            for i, g in groups
        ):
            break
        assert time.monotonic() < give_up, {k: v for k, v in after.items() if "stream" in k[0]}
        await asyncio.sleep(0.05)
    # loaded + 5 reserved, loaded + 1 reserved; the stream keeps them until trimmed
    for item, events in ((scarce, 6), (plenty, 2)):
        length = value(after, "seckill_stream_length", item=str(item))
        assert 0 <= length <= events
    assert grew("seckill_persister_rows_total") == 8
    assert grew("seckill_persister_batch_size_sum") == 8
    assert grew("seckill_persister_batch_size_count") >= 1
    assert grew("seckill_sql_transactions_total", result="commit") >= 1
    assert grew("seckill_sql_transactions_total", result="failure") == 0
    assert grew("seckill_dead_letters_total") == 0
    assert value(after, "seckill_reaper_last_pass_timestamp_seconds") >= started

    # A reconciler pass over a clean sale: every kind of drift present, and zero.
    worker, _ = build_worker(WorkerKind.RECONCILER, api.runtime, asyncio.Event())
    await worker.run_once()
    after = await scrape(api)
    assert grew("seckill_reconciler_passes_total") == 1
    assert value(after, "seckill_reconciler_last_pass_timestamp_seconds") >= started
    drift = by_label(after, "seckill_reconciler_drift", "kind")
    assert drift == dict.fromkeys(Drift, 0.0)


@sqlite_only
async def test_stream_gauges_of_another_consumer_group(api: Api, redis: Redis) -> None:
    """Lag is exact on Redis 7 and counted on 6.2 (the entries after the last delivered one):
    equal here."""
    item_id = await api.create_item(total=5)
    for n in range(2):
        assert (await api.buy(item_id, f"buyer-{n}", "k")).status_code == 202
    stream = item_keys(item_id, DEFAULT_PREFIX).events  # loaded, reserved, reserved
    await redis.xgroup_create(stream, "audit", id="0")
    await redis.xreadgroup("audit", "auditor", {stream: ">"}, count=1)
    samples = await scrape(api)
    item = str(item_id)
    assert value(samples, "seckill_stream_length", item=item) == 3
    assert value(samples, "seckill_stream_pending", item=item, group="audit") == 1
    assert value(samples, "seckill_stream_lag", item=item, group="audit") == 2
    await redis.xreadgroup("audit", "auditor", {stream: ">"})
    samples = await scrape(api)
    assert value(samples, "seckill_stream_pending", item=item, group="audit") == 3
    assert value(samples, "seckill_stream_lag", item=item, group="audit") == 0


@sqlite_only
async def test_metrics_route_is_not_in_the_schema(metered: Api) -> None:
    schema = (await metered.http.get("/openapi.json")).json()
    assert "/metrics" not in schema["paths"]
    samples = await scrape(metered)
    after = await scrape(metered)
    assert outcomes(samples, after, "/metrics") == {"200": 1}


def collected() -> Samples:
    """This process's samples, read as a dashboard reads them: ``registry().collect()``."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in metrics.registry().collect()
        for s in family.samples
    }


async def test_a_shed_purchase_is_counted_on_the_purchase_route() -> None:
    """Admission answers before routing; the metrics still name the route. An app that raises
    is counted as a 500."""
    release = asyncio.Event()
    failing = False

    async def held(scope: Scope, receive: Receive, send: Send) -> None:
        await release.wait()
        if failing:
            raise RuntimeError("the app failed")
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    app = HttpMetrics(AdmissionLimit(held, max_in_flight=1))

    async def post(path: str) -> int:
        return status(await call(app, "POST", path))

    before = collected()
    first = asyncio.create_task(post("/api/v1/items/1/orders"))
    await asyncio.sleep(0)
    assert await asyncio.wait_for(post("/api/v1/items/2/orders"), 5) == 503
    release.set()
    assert await first == 204
    failing = True
    with pytest.raises(RuntimeError):
        await post("/nowhere")
    after = collected()
    assert outcomes(before, after, PURCHASE_ROUTE) == {"overloaded": 1, "204": 1}
    assert outcomes(before, after, "other") == {"500": 1}
    shed = "seckill_shed_total"
    assert value(after, shed) - value(before, shed) == 1


# -- several processes, one metrics directory ----------------------------------------------------

_LISTENING = re.compile(r"API on (http://\S+) ")


@contextlib.contextmanager
def process(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "seckill.cli", *args], env=env, stdout=out, stderr=out
        )
    try:
        yield child
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(20)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def wait_listening(child: subprocess.Popen[bytes], log: Path) -> str:
    give_up = time.monotonic() + 30
    while time.monotonic() < give_up:
        found = _LISTENING.search(log.read_text(errors="replace"))
        if found:
            return found.group(1)
        assert child.poll() is None, log.read_text()
        time.sleep(0.05)
    raise AssertionError(f"the API did not start:\n{log.read_text()}")


@single_redis
@sqlite_only
async def test_any_api_process_shows_the_sum_of_every_process(
    redis_server: RedisTarget, redis: Redis, ledger: Ledger, sql_url: str, tmp_path: Path
) -> None:
    metrics_dir = tmp_path / "metrics"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SECKILL_") and k != "PROMETHEUS_MULTIPROC_DIR"
    } | {
        "SECKILL_REDIS_URL": redis_server.url,
        "SECKILL_DATABASE_URL": sql_url,
        "SECKILL_DATA_DIR": str(tmp_path),
        "SECKILL_JWT_SECRET": JWT_SECRET,
        "SECKILL_PAYMENT_SECRET": PAYMENT_SECRET,
        "SECKILL_METRICS_DIR": str(metrics_dir),
        "SECKILL_API_HOST": "127.0.0.1",
        "SECKILL_API_PORT": "0",
    }
    settings = Settings(jwt_secret=JWT_SECRET, data_dir=tmp_path)
    codec = token_codec(settings)
    admin = {"Authorization": f"Bearer {codec.mint('ops', Role.ADMIN, ttl_seconds=600)}"}
    buyer = {"Authorization": f"Bearer {codec.mint('alice', Role.BUYER, ttl_seconds=600)}"}
    started = time.time()
    with (
        process(["api"], env, tmp_path / "api.log") as api,
        process(["worker", "reaper", "--interval", "0.05"], env, tmp_path / "reaper.log") as reaper,
    ):
        base = await asyncio.to_thread(wait_listening, api, tmp_path / "api.log")
        async with aiohttp.ClientSession(base_url=base) as http:

            async def scrape() -> Samples:
                async with http.get("/metrics") as answer:
                    assert answer.status == 200
                    return parse(await answer.text())

            # The API holds a unit for a second; only the worker process can release it.
            now = datetime.now(UTC)
            item = {
                "name": "Lamp", "price_cents": 100, "total": 1, "hold_seconds": 1,
                "starts_at": (now - timedelta(minutes=1)).isoformat(),
                "ends_at": (now + timedelta(hours=1)).isoformat(),
            }  # fmt: skip
            async with http.post("/api/v1/admin/items", json=item, headers=admin) as answer:
                assert answer.status == 201, await answer.text()
                item_id = (await answer.json())["item_id"]
            async with http.post(f"/api/v1/admin/items/{item_id}/warm", headers=admin) as answer:
                assert answer.status == 200, await answer.text()
            async with http.post(f"/api/v1/items/{item_id}/tickets", headers=buyer) as answer:
                ticket = (await answer.json())["ticket"]
            headers = {**buyer, "Idempotency-Key": "k", TICKET_HEADER: ticket}
            async with http.post(f"/api/v1/items/{item_id}/orders", headers=headers) as answer:
                assert answer.status == 202, await answer.text()

            give_up = time.monotonic() + 15
            while True:
                samples = await scrape()
                if value(samples, "seckill_reaper_releases_total") >= 1:
                    break
                assert time.monotonic() < give_up, "the worker's release never showed"
                await asyncio.sleep(0.1)
        assert value(samples, "seckill_reaper_releases_total") == 1
        assert value(samples, "seckill_reaper_last_pass_timestamp_seconds") >= started
        # The same scrape also shows the API process's own counters.
        counted = value(
            samples, "seckill_http_requests_total", route=PURCHASE_ROUTE, outcome="reserved"
        )
        assert counted == 1
        # Each process wrote files of its own (named by pid) into the one directory: the reaper,
        # the API's worker process, and the server's supervisor (its counters all zero).
        pids = {re.sub(r"\D", "", f.stem.rsplit("_", 1)[-1]) for f in metrics_dir.glob("*.db")}
        assert str(reaper.pid) in pids and len(pids) >= 2, sorted(pids)
    for log in ("api.log", "reaper.log"):
        assert "Traceback" not in (tmp_path / log).read_text(), log


@single_redis
async def test_a_scrape_answers_while_the_whole_cluster_is_down(
    ledger: Ledger, sql_url: str, tmp_path: Path
) -> None:
    """A scrape still answers, as with one Redis down (a cluster client that finds no node to
    learn the slots from raises RedisClusterException, which is no RedisError)."""
    with LocalCluster(masters=3, replicas=0, binary=redis7_binary()) as cluster:
        settings = api_settings(**redis_settings(cluster), database_url=sql_url, data_dir=tmp_path)
        async with running_api(settings) as api:
            await scrape(api)  # the gauges read once, the cluster's slots known
            for node in cluster.nodes:
                node.kill()
            await scrape(api)
