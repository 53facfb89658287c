"""Settings: one typed object, read from ``SECKILL_*`` environment variables (or ``.env``).

Built on demand with ``Settings()``; importing this module creates nothing.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SECKILL_", env_file=".env", extra="ignore")

    redis_url: str = Field(
        "", description="Redis to use, e.g. redis://127.0.0.1:6379/0. Empty: start an embedded one."
    )
    database_url: str = Field(
        "", description="SQLAlchemy async URL. Empty: a SQLite file in the data directory."
    )
    data_dir: Path = Field(Path(".seckill"), description="Where embedded state lives.")
    redis_server_bin: str = Field(
        "", description="Embedded only: a redis-server binary instead of the bundled one."
    )
    redis_max_connections: int = Field(64, ge=1)
    key_prefix: str = Field("seckill", pattern=r"^[A-Za-z0-9_.-]{1,32}$")

    hold_seconds: int = Field(300, ge=1, description="Default time a buyer has to pay.")
    per_buyer_limit: int = Field(1, ge=1, description="Default units one buyer may hold or buy.")
    idempotency_ttl_seconds: int = Field(86_400, ge=1)

    worker_id: int | None = Field(
        None, ge=0, le=1023, description="Fixed order-id worker id. Unset: lease one from Redis."
    )
    worker_id_lease_seconds: int = Field(30, ge=3)

    @property
    def database_url_is_default(self) -> bool:
        return not self.database_url

    @property
    def effective_database_url(self) -> str:
        """The configured database, or the embedded SQLite file in the data directory."""
        return self.database_url or f"sqlite+aiosqlite:///{self.data_dir / 'seckill.db'}"
