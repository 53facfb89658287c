"""Schema migrations (Alembic), run from code: ``seckill db upgrade``, or as a process starts on
the embedded SQLite file; on any other database a process checks the schema it finds
(``schema_problem``)."""

from __future__ import annotations

import functools
from importlib.resources import files

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from seckill.domain.rules import DEFAULT_CURRENCY


class NewerSchema(Exception):
    """The database's schema is at a revision this code does not know: a newer release
    migrated it. ``upgrade`` changes nothing then; the message says what to do."""


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(files("seckill.store") / "migrations"))
    return config


async def upgrade(
    engine: AsyncEngine, revision: str = "head", *, currency: str = DEFAULT_CURRENCY
) -> None:
    """Bring the schema to ``revision``; safe to run again (a no-op when current). ``currency``:
    the deployment's (``SECKILL_CURRENCY``), given to the items on record before items had one.
    ``NewerSchema``, nothing changed, when the database is at a revision this code does not
    know (alembic would fail on it with a traceback)."""

    def run(connection: Connection) -> None:
        _refuse_newer(MigrationContext.configure(connection).get_current_heads())
        config = alembic_config()
        config.attributes["connection"] = connection
        config.attributes["currency"] = currency
        command.upgrade(config, revision)

    async with engine.begin() as connection:
        await connection.run_sync(run)


@functools.cache  # part of the installed code: read once per process (some 40 ms)
def _migrations() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def _refuse_newer(heads: tuple[str, ...]) -> None:
    scripts = _migrations()
    for head in heads:
        try:
            scripts.get_revision(head)
        except CommandError:
            raise NewerSchema(
                f"the database's schema is at revision {head}, newer than this code's "
                f"{scripts.get_current_head()} (a newer release migrated it) and left as it is: "
                "this release's processes run on it (migrations add before they take away), so "
                "start them without `db upgrade`; or deploy the newer release"
            ) from None


async def schema_problem(engine: AsyncEngine) -> str | None:
    """Why the database's schema cannot serve this code, None when it can: it has none, or an
    older revision. A revision this code does not know is newer (another deployment migrated
    first; migrations add before they take away) and serves."""

    def current(connection: Connection) -> tuple[str, ...]:
        return MigrationContext.configure(connection).get_current_heads()

    async with engine.connect() as connection:
        heads = await connection.run_sync(current)
    scripts = _migrations()
    newest = scripts.get_current_head()
    if not heads:
        return f"the database has no schema: run `seckill db upgrade` (revision {newest})"
    try:
        for head in heads:
            scripts.get_revision(head)
    except CommandError:
        return None
    if newest in heads:
        return None
    return (
        f"the database's schema is at revision {', '.join(heads)}, older than this code's "
        f"{newest}: run `seckill db upgrade`"
    )
