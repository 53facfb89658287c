"""The ``seckill`` command: parse, resolve the settings once, call one service, print.

One module per kind of command: ``processes`` runs the API and the workers, ``operations`` is
what an operator does to a deployment, ``rehearsals`` the demo and bench crowds. ``common``
holds what they share (the settings, read once per process), ``output`` what they print.
"""

from __future__ import annotations

import typer

from seckill import __version__
from seckill.cli import operations, processes, rehearsals
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
app.add_typer(operations.commands)
app.add_typer(operations.config_commands, name="config")
app.add_typer(operations.db_commands, name="db")
app.add_typer(operations.item_commands, name="item")
app.add_typer(operations.dead_letter_commands, name="dead-letters")
app.add_typer(operations.refund_commands, name="refunds")
app.add_typer(operations.group_commands, name="groups")
app.add_typer(rehearsals.commands)
