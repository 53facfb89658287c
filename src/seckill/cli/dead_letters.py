"""``seckill dead-letters``: the stream entries the persister or a bridge gave up on, listed,
replayed or dropped."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from seckill.cli.common import (
    abort,
    console,
    current_settings,
    with_runtime,
)

if TYPE_CHECKING:
    from seckill.bootstrap.runtime import Runtime
    from seckill.services.dead_letters import Settled

commands = typer.Typer(
    help="Stream entries the persister or a bridge gave up on.", no_args_is_help=True
)


GROUP_HELP = "One group's only: persister, or a bridge's (bridge-rabbitmq, bridge-nats)."


@commands.command("list")
def dead_letters_list(
    group: str | None = typer.Option(None, help=GROUP_HELP),
    everything: bool = typer.Option(False, "--all", help="Include replayed and dropped ones."),
) -> None:
    """Show dead letters with their errors: the persister's (in SQL) and the bridges' (on the
    items' dead-letter streams)."""
    from seckill.cli.output import print_dead_letters
    from seckill.services.dead_letters import list_dead_letters

    letters = with_runtime(
        lambda rt: list_dead_letters(rt.ledger, rt.engine, group=group, include_settled=everything)
    )
    print_dead_letters(console, letters)


@commands.command("replay")
def dead_letters_replay(
    ids: list[str] = typer.Argument(None, help="Dead letter ids (default: every pending one)."),
    group: str | None = typer.Option(None, help=GROUP_HELP),
    to: str | None = typer.Option(
        None, help="The broker for a bridge's letters (default SECKILL_BRIDGE_URL)."
    ),
) -> None:
    """Replay dead letters once what made them fail is fixed: the persister's land in SQL, a
    bridge's are published to its broker again. Each is replayed once at most."""
    from seckill.cli.output import print_settled
    from seckill.services.dead_letters import replay_dead_letters
    from seckill.sinks import sink_from_url

    url = to or current_settings().bridge_url
    try:
        sink = sink_from_url(url) if url else None
    except ValueError as exc:
        abort(exc)

    async def replay(runtime: Runtime) -> Settled:
        try:
            return await replay_dead_letters(
                runtime.ledger, runtime.engine, ids or (), group=group, sink=sink
            )
        finally:
            if sink is not None:
                await sink.close()

    done = with_runtime(replay)
    print_settled(console, done, "replayed")
    if not done.ok:
        raise typer.Exit(1)


@commands.command("drop")
def dead_letters_drop(
    ids: list[str] = typer.Argument(..., help="Dead letter ids."),
    group: str | None = typer.Option(None, help=GROUP_HELP),
) -> None:
    """Give up on dead letters for good (what they carry never lands or reaches the broker):
    the persister's stay in SQL, marked dropped; a bridge's leave the dead-letter stream."""
    from seckill.cli.output import print_settled
    from seckill.services.dead_letters import drop_dead_letters

    done = with_runtime(lambda rt: drop_dead_letters(rt.ledger, rt.engine, ids, group=group))
    print_settled(console, done, "dropped")
    if not done.ok:
        raise typer.Exit(1)
