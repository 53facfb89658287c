"""The ``seckill`` command: parse, resolve the settings once, call one service, print.

One module per group of commands, as ``seckill.api`` has one per router: ``processes`` runs the
API and the workers; what an operator does to a deployment is ``settings`` (``seckill config``),
``database`` (``db``), ``items`` (``item``, ``warm``), ``repairs`` (``reconcile``,
``recover``), ``dead_letters``, ``refunds``, ``groups`` and ``tokens`` (``token``);
``rehearsals`` the demo and bench crowds. ``common`` holds what they share (the settings, read
once per process), ``output`` what they print.
"""

from __future__ import annotations

import typer

from seckill import __version__
from seckill.cli import (
    database,
    dead_letters,
    groups,
    items,
    processes,
    refunds,
    rehearsals,
    repairs,
    settings,
    tokens,
)
from seckill.cli.common import console

app = typer.Typer(help="seckill: a flash-sale backend.", no_args_is_help=True, add_completion=False)


@app.callback()
def main() -> None:
    """Flash sales decided in Redis, one atomic script per purchase."""


@app.command()
def version() -> None:
    """Print the version."""
    console.print(f"seckill {__version__}")


app.add_typer(processes.commands)
app.add_typer(processes.worker_commands, name="worker")
app.add_typer(tokens.commands)
app.add_typer(items.warm_commands)
app.add_typer(repairs.commands)
app.add_typer(settings.commands, name="config")
app.add_typer(database.commands, name="db")
app.add_typer(items.commands, name="item")
app.add_typer(dead_letters.commands, name="dead-letters")
app.add_typer(refunds.commands, name="refunds")
app.add_typer(groups.commands, name="groups")
app.add_typer(rehearsals.commands)
