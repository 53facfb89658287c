"""``seckill db``: the SQL database's schema."""

from __future__ import annotations

import asyncio

import typer

from seckill.cli.common import (
    abort,
    checked_settings,
    console,
)

commands = typer.Typer(help="The SQL database.", no_args_is_help=True)


@commands.command("upgrade")
def db_upgrade() -> None:
    """Create or migrate the schema to the newest revision."""
    from seckill.bootstrap.tls import database_ssl_context
    from seckill.cli.common import database_trouble
    from seckill.store.database import open_database
    from seckill.store.migrate import NewerSchema, upgrade

    settings = checked_settings(tokens=False)  # the profile's refusal first: no file made
    tls = database_ssl_context(settings)

    async def main() -> None:
        database = open_database(settings.effective_database_url, tls=tls)
        try:
            await upgrade(database, currency=settings.currency)
        finally:
            await database.dispose()

    try:
        asyncio.run(main())
    except NewerSchema as exc:
        abort(exc)
    except Exception as exc:
        trouble = database_trouble(exc)
        if trouble is None:
            raise
        abort(trouble)
    console.print("schema is current")
