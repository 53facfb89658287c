"""What a person watches: the crowd's progress while it runs, the result when it is done."""

from __future__ import annotations

from collections import Counter

from rich.console import Console, Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table

from seckill.crowd.crowd import CrowdLog
from seckill.crowd.result import CrowdResult, WaitingRoomOut
from seckill.crowd.sale import Sale
from seckill.domain.queue import QueueState


class LiveView:
    """A rich renderable redrawn from the log on every refresh (``rich.live.Live``)."""

    def __init__(self, sale: Sale) -> None:
        self.sale = sale

    def __rich__(self) -> RenderableType:
        log, plan = self.sale.log, self.sale.plan
        elapsed = log.now()
        requests = len(log.samples)
        everyone = plan.buyers + plan.late_crowd
        head = Table.grid(padding=(0, 2))
        head.add_row(
            f"[bold]{log.phase}[/]",
            ProgressBar(total=everyone, completed=log.buyers_sent, width=30),
            f"buyers {log.buyers_sent:,}/{everyone:,}   {elapsed:5.1f} s   requests {requests:,}"
            f" ({requests / elapsed if elapsed else 0:,.0f}/s)",
        )
        answers = Table(box=None, pad_edge=False)
        for column in ("action", "outcome", "count"):
            answers.add_column(column, justify="right" if column == "count" else "left")
        for (action, outcome), count in sorted(log.counts.items()):
            answers.add_row(action, outcome, f"{count:,}")
        watch = self.sale.watch
        latest = watch.latest if watch else None
        if latest is None or latest.get("redis") is None:
            stock = "stock: waiting for the first look"
        else:
            redis = latest["redis"]
            stock = (
                f"stock: available [green]{redis['available']:,}[/]  held "
                f"[yellow]{redis['held']:,}[/]  sold [cyan]{redis['sold']:,}[/] of "
                f"{redis['total']:,}   not yet in SQL: {latest['backlog']:,}"
            )
        if self.sale.queue is None:
            return Group(head, stock, answers)
        return Group(head, stock, _queue_line(log), answers)


def _queue_line(log: CrowdLog) -> str:
    states = Counter(visit.state for visit in log.visits.values())
    before = sum(1 for visit in log.visits.values() if visit.before_start)
    return (
        f"waiting room: joined {len(log.visits):,} ({before:,} before the start), admitted up "
        f"to {log.admitted_up_to_seen:,}; waiting [yellow]{states[QueueState.WAITING]:,}[/], "
        f"admitted [green]{states[QueueState.ADMITTED]:,}[/], sold out "
        f"[cyan]{states[QueueState.SOLD_OUT]:,}[/]"
    )


def print_result(console: Console, result: CrowdResult) -> None:
    answers = Table(title=f"Answers (item {result['item_id']})")
    for column in ("action", "outcome", "count", "req/s", "p50 ms", "p95 ms", "p99 ms"):
        answers.add_column(column, justify="left" if column in ("action", "outcome") else "right")
    for row in result["outcomes"]:
        answers.add_row(
            row["action"], row["outcome"], f"{row['count']:,}", f"{row['rps']:,.1f}",
            f"{row['p50_ms']:.2f}", f"{row['p95_ms']:.2f}", f"{row['p99_ms']:.2f}",
        )  # fmt: skip
    console.print(answers)
    console.print(
        f"{result['buyers']:,} buyers and {result['requests']:,} requests in "
        f"{result['crowd_s']:.1f} s: {result['buyers_per_s']:,.0f} buyers/s, "
        f"{result['throughput_rps']:,.0f} req/s; {result['transport_errors']} without an answer"
    )
    verdicts = Table(title="Verdict")
    for column in ("check", "result", "detail"):
        verdicts.add_column(column)
    for verdict in result["verdicts"]:
        shown = "[green]pass[/]" if verdict["ok"] else "[red]FAIL[/]"
        verdicts.add_row(verdict["name"], shown, verdict["detail"])
    console.print(verdicts)
    if "waiting_room" in result:
        console.print(_queue_summary(result["waiting_room"]))
    console.print(
        "[bold green]All checks pass.[/]" if result["passed"] else "[bold red]Checks failed.[/]"
    )


def _queue_summary(room: WaitingRoomOut) -> str:
    if room["rank_correlation"] is None:
        draw = f"too few drawn to judge the draw ({room['drawn']})"
    else:
        draw = (
            f"arrival vs drawn position rho {room['rank_correlation']:+.3f} "
            f"(|rho| < {room['unrelated_bound']:.3f})"
        )
    spread = room["sold_out_propagation_s"]
    sold_out = "nobody read sold_out" if spread is None else f"{spread:.2f} s"
    return (
        f"Waiting room: {room['joined']:,} joined ({room['joined_before_start']:,} before the "
        f"start), positions 1..{room['length']:,}, admitted up to {room['admitted_up_to']:,} in "
        f"{len(room['admissions']['upto']):,} steps; {draw}; sold out reached every waiting "
        f"buyer in {sold_out} (bound {room['propagation_bound_s']:.2f} s)"
    )
