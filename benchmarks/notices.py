"""What a payment notice costs now that it is answered only once SQL holds it.

    python -m benchmarks.notices [--orders 1000] [--rate 200] [--database-url URL]

A private redis-server, ``seckill api`` and ``seckill worker persister`` as processes of their
own (each one's CPU is its own), on a SQLite file of its own or ``--database-url``. Twice
``--orders`` buyers reserve a unit each and the backlog lands; then, at ``--rate`` a second,
the provider's success notices (each of its order's sum) for half of them, each answered once
SQL holds the payment, then the buyers' cancels of the other half: a cancel is the shape a
notice had before (one script, one read of the hold, no wait for SQL), so the two phases, in
one run, show what the wait costs. Printed per phase: latency p50/p99/max, the API's and the
persister's CPU per request; the last line one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import uvloop
from rich.console import Console
from rich.table import Table

from benchmarks.harness import (
    api,
    child_env,
    cpu_spent,
    create_item,
    credentials,
    drained,
    fetch_tickets,
    free_port,
    make_crowd,
    percentile,
    redis_binary,
    running,
    seckill_command,
    seckill_settings,
    serving,
    status_key,
    upgrade_database,
)
from seckill.crowd.client import ApiClient, Reply
from seckill.domain.money import Money
from seckill.redis_server import RedisServer

CONCURRENCY = 64


async def paced(
    calls: Sequence[Callable[[], Awaitable[Reply]]], rate: float
) -> tuple[list[float], Counter[str]]:
    """Each call started at ``rate`` a second (not waiting for the one before, as a provider's
    notices arrive); each one's latency in ms, and the answers by status."""
    latencies: list[float] = []
    answers: Counter[str] = Counter()

    async def timed(call: Callable[[], Awaitable[Reply]]) -> None:
        sent = time.perf_counter()
        reply = await call()
        latencies.append((time.perf_counter() - sent) * 1000)
        answers[status_key(reply)] += 1

    tasks = []
    start = time.perf_counter()
    for n, call in enumerate(calls):
        await asyncio.sleep(max(0.0, start + n / rate - time.perf_counter()))
        tasks.append(asyncio.create_task(timed(call)))
    await asyncio.gather(*tasks)
    return latencies, answers


async def sale(url: str, args: argparse.Namespace, pids: dict[str, int | None]) -> dict[str, Any]:
    who = credentials()
    async with api(url, who, CONCURRENCY) as client:
        item_id = await create_item(client, total=2 * args.orders)
        card = (await client.request("GET", f"/api/v1/items/{item_id}")).body
        price = Money(int(card["price_cents"]), str(card["currency"]))  # each order's: one unit
        buyers = make_crowd(who, "n", 2 * args.orders)
        await fetch_tickets(client, item_id, buyers, CONCURRENCY)
        orders: list[tuple[str, str]] = []
        for buyer in buyers:
            held = await client.buy(item_id, buyer.name, ticket=buyer.ticket, key=buyer.key,
                                    quantity=1)  # fmt: skip
            if held.status != 202:
                raise SystemExit(f"a purchase was refused: {held.status} {held.body}")
            orders.append((buyer.name, str(held.body["order_id"])))
        await drained(client, item_id, timeout_s=120)
        paid, cancelled = orders[: args.orders], orders[args.orders :]

        def notice(order_id: str) -> Callable[[], Awaitable[Reply]]:
            return lambda: client.notify_payment(
                item_id, order_id, payment_id=f"pay-{order_id}", succeeded=True, amount=price
            )

        def cancel(c: ApiClient, buyer: str, order_id: str) -> Callable[[], Awaitable[Reply]]:
            return lambda: c.cancel(buyer, item_id, order_id)

        figures: dict[str, Any] = {}
        phases = {
            "notice (durable)": [notice(order_id) for _, order_id in paid],
            "cancel (no wait)": [cancel(client, b, order_id) for b, order_id in cancelled],
        }
        for name, calls in phases.items():
            with cpu_spent(pids) as spent:
                latencies, answers = await paced(calls, args.rate)
            latencies.sort()
            figures[name] = {
                "p50_ms": percentile(latencies, 0.50),
                "p99_ms": percentile(latencies, 0.99),
                "max_ms": round(latencies[-1], 1),
                "api_cpu_us": round(spent["api"] / len(calls) * 1e6, 1),
                "persister_cpu_us": round(spent["persister"] / len(calls) * 1e6, 1),
                "answers": dict(answers),
            }
        await drained(client, item_id, timeout_s=120)
    return figures


def measure(args: argparse.Namespace) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="seckill-notices-") as scratch,
        RedisServer(binary=redis_binary(None), port=free_port()) as redis,
    ):
        workdir = Path(scratch)
        database_url = args.database_url or f"sqlite+aiosqlite:///{workdir / 'seckill.db'}"
        env = child_env(
            seckill_settings(workdir, redis_url=redis.url, database_url=database_url,
                             concurrency=CONCURRENCY)
        )  # fmt: skip
        upgrade_database(env, workdir)
        port = free_port()
        argv = seckill_command("api", "--host", "127.0.0.1", "--port", str(port))
        persister_argv = seckill_command("worker", "persister")
        with (
            serving(argv, port=port, env=env, cwd=workdir, log=workdir / "api.log") as api_process,
            running(persister_argv, env=env, cwd=workdir, log=workdir / "persister.log") as worker,
        ):
            pids: dict[str, int | None] = {"api": api_process.pid, "persister": worker.pid}
            return uvloop.run(sale(f"http://127.0.0.1:{port}", args, pids))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=1000, help="Notices (and as many cancels).")
    parser.add_argument("--rate", type=float, default=200, help="Requests started per second.")
    parser.add_argument("--database-url", help="Default: a SQLite file of the run's own.")
    args = parser.parse_args()
    figures = measure(args)
    table = Table(title=f"{args.orders} notices, then {args.orders} cancels, {args.rate:g}/s")
    for column in ("request", "p50 ms", "p99 ms", "max ms", "API CPU µs", "persister CPU µs",
                   "answers"):  # fmt: skip
        table.add_column(column)
    for name, row in figures.items():
        table.add_row(name, *(str(row[k]) for k in ("p50_ms", "p99_ms", "max_ms", "api_cpu_us",
                                                     "persister_cpu_us", "answers")))  # fmt: skip
    Console().print(table)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
