"""Rehearsing a sale: the demo on embedded defaults, and bench against a running deployment."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import typer

from seckill.cli.common import abort, console, current_settings
from seckill.crowd.plan import CrowdPlan

commands = typer.Typer()

_PLAN = {f.name: f.default for f in dataclasses.fields(CrowdPlan)}  # the crowd's defaults
# How far apart the crowd's clock and a deployment's Redis may be: hosts kept by NTP agree to
# well within it. On one host (the demo) there is one clock.
BENCH_CLOCK_S = 1.0
_REPORT_DIR = typer.Option(
    Path("seckill-reports"), help="Where the JSON result and the HTML report are written."
)
_CONCURRENCY = typer.Option(_PLAN["concurrency"], min=1, help="Buyers in flight at once.")
_LIMIT = typer.Option(_PLAN["per_buyer_limit"], min=1, help="Units one buyer may hold or buy.")
_HOLD = typer.Option(_PLAN["hold_seconds"], min=1, help="Seconds a buyer has to pay.")
_UNITS = typer.Option(_PLAN["units"], min=1, help="Units on sale.")
_WAITING_ROOM_HELP = (
    "The crowd queues in the waiting room first: the sale starts a few seconds after the item "
    "is made, the first crowd joins before it, the late crowd after; five more verdicts judge "
    "the queue."
)


@commands.command()
def demo(
    buyers: int = typer.Option(_PLAN["buyers"], min=1, help="Buyers in the first crowd."),
    units: int = _UNITS,
    limit: int = _LIMIT,
    hold_seconds: int = _HOLD,
    concurrency: int = _CONCURRENCY,
    report_dir: Path = _REPORT_DIR,
    redis_cluster: int = typer.Option(
        0,
        min=0,
        max=16,
        help="Run on a local Redis Cluster of this many masters (a replica each), not the "
        "embedded Redis.",
    ),
    waiting_room: bool = typer.Option(
        False, help=_WAITING_ROOM_HELP + " The item has one, paced for the crowd."
    ),
    direct_item: bool = typer.Option(
        False,
        help="With --waiting-room: meanwhile a second crowd like the first buys a second item, "
        "which has no waiting room, in the same deployment; both sales are judged.",
    ),
    bridge: str | None = typer.Option(
        None,
        metavar="URL",
        help="The server runs the bridge to this broker (amqp://... RabbitMQ, nats://... NATS "
        "JetStream), and a consumer of its default topology (queue seckill.orders; stream "
        "SECKILL_ORDERS) checks that every order event of the sale arrived once, in order.",
    ),
) -> None:
    """A live flash sale on embedded defaults, rushed by a crowd over HTTP, and its verdict.

    Exit 1 if any check fails.
    """
    from seckill.demo import run_demo
    from seckill.sinks import sink_from_url

    if bridge:
        try:
            sink_from_url(bridge)  # only to refuse a URL no sink takes, before anything starts
        except ValueError as exc:
            abort(exc)
    plan = _plan(
        buyers=buyers, units=units, per_buyer_limit=limit, hold_seconds=hold_seconds,
        concurrency=concurrency,
    )  # fmt: skip
    console.print(
        f"[bold]Flash sale[/]: {plan.buyers:,} buyers (then {plan.late_crowd:,} late ones) for "
        f"{plan.units:,} units, limit {plan.per_buyer_limit} each, holds of {plan.hold_seconds} s,"
        f" {plan.concurrency} in flight"
        + (", through a waiting room" if waiting_room else "")
        + (", and as many for an item without one" if waiting_room and direct_item else "")
        + (", order events to a broker" if bridge else "")
    )

    def run() -> bool:
        return run_demo(
            plan, report_dir=report_dir, console=console, redis_cluster=redis_cluster,
            waiting_room=waiting_room, direct_item=direct_item, bridge_url=bridge,
        )  # fmt: skip

    _verdict(run)


@commands.command()
def bench(
    url: str = typer.Option(..., help="The deployment's base URL, e.g. http://127.0.0.1:8000."),
    admin_token: str | None = typer.Option(
        None, envvar="SECKILL_ADMIN_TOKEN", help="An admin token (default: minted from the keys)."
    ),
    database_url: str | None = typer.Option(
        None,
        help="The deployment's SQL database, to audit its order rows too (over TLS as "
        "SECKILL_DATABASE_TLS and its files say).",
    ),
    buyers: int = typer.Option(
        _PLAN["buyers"], min=1, help="Buyers in the first crowd (a cap with --duration)."
    ),
    late_buyers: int | None = typer.Option(
        _PLAN["late_buyers"],
        min=0,
        help="Buyers for the units that come back (default: a quarter of --buyers).",
    ),
    duration: float | None = typer.Option(
        _PLAN["duration_s"],
        min=0.1,
        help="Seconds the first crowd keeps arriving (default: until --buyers).",
    ),
    units: int = _UNITS,
    limit: int = _LIMIT,
    hold_seconds: int = _HOLD,
    concurrency: int = _CONCURRENCY,
    pay: float = typer.Option(_PLAN["pay"], min=0, max=1, help="Share of holds paid."),
    fail: float = typer.Option(
        _PLAN["fail"], min=0, max=1, help="Share of holds whose payment fails."
    ),
    cancel: float = typer.Option(_PLAN["cancel"], min=0, max=1, help="Share of holds cancelled."),
    replay: float = typer.Option(
        _PLAN["replay"], min=0, max=1, help="Share of buyers who click twice."
    ),
    double_charge: float = typer.Option(
        _PLAN["double_charge"],
        min=0,
        max=1,
        help="Share of paying buyers charged twice (the second charge is owed back).",
    ),
    stray_charges: bool = typer.Option(
        _PLAN["stray_charges"],
        help="Once per sale, charge one order a cent short and an order never issued (each "
        "owed back in full, the short one still payable).",
    ),
    seed: int = typer.Option(_PLAN["seed"], help="The crowd's random seed."),
    report_dir: Path = _REPORT_DIR,
    waiting_room: bool = typer.Option(
        False,
        help=_WAITING_ROOM_HELP + " The item is created with one (the deployment runs the "
        "inlet: `seckill serve` does); its SECKILL_QUEUE_FRONT_SECONDS sets the sold-out bound, "
        "and clocks may differ by 1 s.",
    ),
) -> None:
    """Rehearse a sale against a running deployment and print the verdict.

    A new item, the crowd over HTTP, per outcome req/s and latency, then the verdict (exit 1 if
    any check fails, 2 if the sale could not be set up). Buyer tokens and payment notices are
    signed with the deployment's keys, read from the same SECKILL_* settings it runs with.
    """
    from seckill.bootstrap.keys import crowd_credentials
    from seckill.bootstrap.tls import database_ssl_context
    from seckill.crowd.plan import QueuePlan
    from seckill.crowd.rehearsal import rehearse

    plan = _plan(
        buyers=buyers, late_buyers=late_buyers, duration_s=duration, units=units,
        per_buyer_limit=limit, hold_seconds=hold_seconds, concurrency=concurrency, pay=pay,
        fail=fail, cancel=cancel, replay=replay, double_charge=double_charge,
        stray_charges=stray_charges, seed=seed,
    )  # fmt: skip
    settings = current_settings()
    try:
        credentials = crowd_credentials(settings, admin_token=admin_token)
        database = settings.model_copy(update={"database_url": database_url or ""})
        database_tls = database_ssl_context(database) if database_url else None
    except ValueError as exc:  # a ConfigurationError too
        abort(exc)
    queue = None
    if waiting_room:  # the crowd's clock and the deployment's Redis may be on other hosts
        queue = QueuePlan(front_s=settings.queue_front_seconds, clock_tolerance_s=BENCH_CLOCK_S)

    def run() -> bool:
        rehearsal = rehearse(
            url, plan, credentials, kind="bench", console=console, database_url=database_url,
            database_tls=database_tls, report_dir=report_dir, queue=queue,
            prefix=settings.key_prefix,
        )  # fmt: skip
        return asyncio.run(rehearsal).result["passed"]

    _verdict(run)


def _plan(**options: Any) -> CrowdPlan:
    try:
        return CrowdPlan(**options)
    except ValueError as exc:
        abort(exc)


def _verdict(rehearse: Callable[[], bool]) -> NoReturn:
    """Exit 0 if the rehearsal's verdicts all pass, 1 if one fails, 2 if it could not run."""
    import aiohttp

    from seckill.crowd.sale import SaleRefused
    from seckill.demo import ServerFailed
    from seckill.sinks import SinkError

    try:
        passed = rehearse()
    except (ServerFailed, SaleRefused, SinkError, aiohttp.ClientError) as exc:
        abort(exc)
    raise typer.Exit(0 if passed else 1)
