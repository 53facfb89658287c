"""``seckill groups``: the consumer groups that follow every item stream, listed and retired."""

from __future__ import annotations

import typer

from seckill.cli.common import (
    console,
    with_runtime,
)

commands = typer.Typer(
    help="The consumer groups that follow every item stream (the persister, each bridge).",
    no_args_is_help=True,
)


@commands.command("list")
def groups_list() -> None:
    """The registered groups: each is made on every item stream, and trimming waits for it."""
    from seckill.services.stream_groups import list_groups

    groups = with_runtime(lambda rt: list_groups(rt.engine, rt.ledger))
    for group in groups:
        console.print(group, markup=False)
    if not groups:  # a reader registers its group as it starts
        console.print("no group registered yet: no persister or bridge has run")


@commands.command("retire")
def groups_retire(
    group: str = typer.Argument(..., help="A bridge's group: bridge-<sink>."),
) -> None:
    """Take a group out of service for good (a bridge no longer run): off the registry (Redis's
    and SQL's) and every item stream, so the streams stop keeping what it never reads. Stop its
    workers first: a running one registers it again."""
    from seckill.services.stream_groups import retire

    left = with_runtime(lambda rt: retire(rt.engine, rt.ledger, group))
    console.print(f"{group} retired: it left {left} item streams", markup=False)
