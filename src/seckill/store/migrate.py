"""Schema migrations (Alembic), run from code: ``seckill db upgrade`` or at worker start."""

from __future__ import annotations

from importlib.resources import files

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncEngine


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(files("seckill.store") / "migrations"))
    return config


async def upgrade(engine: AsyncEngine, revision: str = "head") -> None:
    """Bring the schema to ``revision``; safe to run again (a no-op when current)."""

    def run(connection: Connection) -> None:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.upgrade(config, revision)

    async with engine.begin() as connection:
        await connection.run_sync(run)
