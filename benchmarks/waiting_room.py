"""The waiting room's two buyer routes against the bare server's hello: one run.

Three targets, one after the other, from keep-alive connections (``--connections``, 64) for
``--duration`` seconds each after a warm-up, with the load generator of ``benchmarks.http``
(wrk when installed) and the same server stack (``--server``, ``--workers``):

* ``hello raw``: the bare ASGI hello, the floor every ratio divides by;
* ``join``: ``POST /api/v1/items/{id}/queue``, every request a new buyer (a token the API has
  never seen, and a write in Redis: each one takes the next position);
* ``poll``: ``GET /api/v1/items/{id}/queue`` with a pass, from a pool of buyers who joined
  before the clock, asked again and again as waiting buyers do (each process reads the queue's
  front once per ``queue_front_seconds`` for all of them).

The product is ``seckill api`` with ``SECKILL_WAITING_ROOM=true`` over its own redis-server
(AOF on) and SQLite, with ``seckill worker inlet`` moving the queue meanwhile (1,000 a second),
so the front changes under the polls. Reported: req/s, p50/p99, CPU per answer of the API
process and of redis-server, the ratios to the bare hello; the last line is one JSON object.
No audit: nothing is sold. The options are ``benchmarks.http``'s.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import uvloop

from benchmarks.harness import (
    Buyer,
    api,
    child_env,
    create_item,
    credentials,
    durable_redis,
    free_port,
    make_crowd,
    running,
    seckill_command,
    seckill_settings,
    serving,
    upgrade_database,
)
from benchmarks.http import (
    MIN_POOL,
    Load,
    Requests,
    Shape,
    generate,
    hello_server,
    parse_args,
    report,
    timed,
    write_requests,
)
from seckill.crowd.client import ApiClient, Credentials

QUEUE_PATH = "/api/v1/items/{item_id}/queue"
JOIN = Shape("POST", QUEUE_PATH, b"", ("token",))
POLL = Shape("GET", QUEUE_PATH, b"", ("token", "pass"))
POLLERS = 5_000  # buyers whose passes the polls rotate through
ITEM_UNITS = 1_000_000
WAITING_ROOM = {
    "waiting_room": True,
    "queue_admit_per_second": 1_000,
    "queue_admit_per_unit": 0,
}


async def joined(url: str, who: Credentials, item_id: int, buyers: Sequence[Buyer]) -> None:
    """Each buyer in the queue, its pass kept where a ticket would be."""
    async with api(url, who, 64) as client:
        for buyer in buyers:
            buyer.ticket = await join(client, item_id, buyer.name)


async def join(client: ApiClient, item_id: int, buyer: str) -> str:
    path = QUEUE_PATH.format(item_id=item_id)
    reply = await client.request("POST", path, token=client.credentials.buyer(buyer))
    if reply.status != 200:
        sys.exit(f"{buyer} could not join: {reply.status} {reply.body}")
    return str(reply.body["pass"])


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    print(f"{args.server}, generator {args.generator}, {args.connections} connections, "
          f"{args.workers} worker process, {args.duration:g} s timed", flush=True)  # fmt: skip
    who = credentials()
    loads: dict[str, Load] = {}
    with tempfile.TemporaryDirectory(prefix="seckill-queue-") as tmp:
        workdir = Path(tmp)
        with durable_redis(args.redis_server, workdir / "redis") as redis:
            database_url = f"sqlite+aiosqlite:///{workdir / 'seckill.db'}"
            settings = seckill_settings(
                workdir / "seckill", redis_url=redis.url, database_url=database_url,
                concurrency=args.connections,
            )  # fmt: skip
            env = child_env(settings | WAITING_ROOM)
            upgrade_database(env, workdir)
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            api_argv = seckill_command("api", "--host", "127.0.0.1", "--port", str(port))
            api_argv += ["--workers", str(args.workers), "--server", args.server]
            inlet = seckill_command("worker", "inlet")
            with (
                serving(api_argv, port=port, env=env, cwd=workdir, log=workdir / "api.log") as app,
                running(inlet, env=env, cwd=workdir, log=workdir / "inlet.log"),
            ):
                pids = {"server": app.pid, "redis": redis.process.pid if redis.process else None}

                async def set_up() -> int:
                    async with api(url, who, 4) as client:
                        return await create_item(client, total=ITEM_UNITS)

                item_id = uvloop.run(set_up())
                made = 0

                def new_buyers(count: int, name: str, shape: Shape) -> Requests:
                    nonlocal made
                    crowd = make_crowd(who, f"b{made}-", count)
                    made += count
                    if shape is POLL:
                        uvloop.run(joined(url, who, item_id, crowd))
                    return write_requests(crowd, who, workdir / f"{name}.txt", shape)

                sample = new_buyers(MIN_POOL, "sample", JOIN)
                with hello_server("raw", workdir, args) as (hello_url, process):
                    if args.warm_up:
                        generate(hello_url, item_id, sample, args.warm_up, args)
                    loads["hello raw"] = timed(
                        "hello raw", hello_url, item_id, sample, args, {"server": process.pid}
                    )
                ceiling = loads["hello raw"].per_second or 10_000.0
                if args.warm_up:
                    generate(
                        url, item_id, new_buyers(MIN_POOL, "join-warm", JOIN), args.warm_up, args
                    )
                count = max(MIN_POOL, int(ceiling * args.duration)) + 20 * args.connections
                loads["join"] = timed(
                    "join", url, item_id, new_buyers(count, "join", JOIN), args, pids
                )
                polls = new_buyers(POLLERS, "poll", POLL)
                if args.warm_up:
                    generate(url, item_id, polls, args.warm_up, args)
                loads["poll"] = timed("poll", url, item_id, polls, args, pids)
    report(loads, {"hello raw": "200", "join": "200", "poll": "200"})

    def per_answer_us(load: Load, process: str) -> float:
        rate = load.per_second
        return round(load.cpu.get(process, 0.0) / rate * 1e6, 1) if rate else 0.0

    floor = loads["hello raw"].per_second or 1.0
    summary = {
        "joins_per_s": round(loads["join"].per_second, 1),
        "polls_per_s": round(loads["poll"].per_second, 1),
        "vs_bare_hello": {n: round(loads[n].per_second / floor, 3) for n in ("join", "poll")},
        "p99_ms": {name: round(load.p99_ms, 2) for name, load in loads.items()},
        "api_cpu_us": {n: per_answer_us(loads[n], "server") for n in ("join", "poll")},
        "redis_cpu_us": {n: per_answer_us(loads[n], "redis") for n in ("join", "poll")},
        "server": args.server,
        "generator": args.generator,
        "workers": args.workers,
        "connections": args.connections,
        "duration_s": args.duration,
    }
    print(json.dumps(summary))
    failed = {n: load.others("200") for n, load in loads.items() if load.others("200") != "-"}
    if failed:
        sys.exit(f"answers other than 200: {failed}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit("interrupted")
