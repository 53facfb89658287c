"""Every check a process or command makes of its settings before it starts anything, in one
list (``configuration_problems``; `seckill config check` prints the same): what the profile asks
for (``profile_problems``), whether each URL names something this code can reach (a driver it
has, a scheme it speaks, a port that is a number), whether the key settings agree with each
other, then whether what is set can be used (the TLS files, the key lists, the token keys), each
read as the process would read it. Every line names its setting and shows no credential."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from seckill.bootstrap.keys import payment_secret, ticket_secret, token_codec
from seckill.bootstrap.tls import database_ssl_context, redis_ssl_options
from seckill.config import Settings
from seckill.domain.configuration import ENV_PREFIX, ConfigurationError, variable
from seckill.domain.masking import mask_url
from seckill.sinks.by_url import NATS_SCHEMES, RABBITMQ_SCHEMES

REDIS_SCHEMES = ("redis", "rediss", "unix")
JWKS_SCHEMES = ("https", "http")
BRIDGE_SCHEMES = tuple(sorted(RABBITMQ_SCHEMES | NATS_SCHEMES))


def configuration_problems(settings: Settings, *, fetch_key_set: bool = True) -> list[str]:
    """One line per problem (none: the process can start). Reads the files the settings name
    and, with SECKILL_JWT_JWKS_URL and ``fetch_key_set``, fetches the key set (a command that
    checks no token leaves it at its URL's form: an identity provider that is down must not
    stop a migration); generates nothing: a key left unset is checked only where the profile
    asks for it."""
    problems = profile_problems(settings)
    problems.extend(url_problems(settings))
    problems.extend(key_setting_problems(settings))
    checks: list[Callable[[], object]] = [
        lambda: redis_ssl_options(settings),
        lambda: database_ssl_context(settings),
    ]
    if settings.ticket_secret:
        checks.append(lambda: ticket_secret(settings))
    if settings.payment_secret:
        checks.append(lambda: payment_secret(settings))
    fetched = bool(settings.jwt_jwks_url) and settings.jwt_jwks_file is None
    if (
        not token_key_problems(settings)
        and _token_keys_set(settings)
        and (fetch_key_set or not fetched)
    ):
        checks.append(lambda: token_codec(settings))
    for check in checks:
        try:
            check()
        except (ValueError, OSError) as exc:  # ConfigurationError is a ValueError
            problems.append(str(exc))
    return problems


def profile_problems(settings: Settings) -> list[str]:
    """What keeps the settings from running under their profile, one line per setting at fault
    (none in the embedded profile, where defaults stand in)."""
    if settings.profile != "production":
        return []
    found = []
    if not settings.redis_url:
        found.append(_missing("redis_url", "the Redis every process shares, none embedded"))
    if not settings.database_url:
        found.append(_missing("database_url", "the SQL database, no SQLite file"))
    elif settings.database_url.partition(":")[0].lower().split("+")[0] == "sqlite":
        found.append(
            f"{ENV_PREFIX}DATABASE_URL is a SQLite file ({mask_url(settings.database_url)}): "
            "each host would keep a ledger of its own; the production profile needs a "
            "database server every host shares (postgresql+asyncpg://, mysql+asyncmy://)"
        )
    for name in ("ticket_secret", "payment_secret"):
        if not getattr(settings, name):
            found.append(_missing(name, "a key every host shares, none generated"))
    found.extend(token_key_problems(settings))
    return found


def token_key_problems(settings: Settings) -> list[str]:
    """What the production profile misses to verify tokens."""
    if settings.jwt_jwks_file is not None or settings.jwt_jwks_url:
        return []  # the key set (token_codec checks it is one)
    if settings.jwt_algorithm == "HS256" and not settings.jwt_secret:
        return [_missing("jwt_secret", "the tokens' HS256 key, none generated")]
    if settings.jwt_algorithm != "HS256" and settings.jwt_public_key_file is None:
        return [
            _missing(
                "jwt_public_key_file",
                "the PEM key that checks tokens (or a key set: SECKILL_JWT_JWKS_FILE or "
                "SECKILL_JWT_JWKS_URL)",
            )
        ]
    return []


def require_runnable(settings: Settings) -> None:
    """Raise ``ConfigurationError`` naming every problem of the profile (``profile_problems``)."""
    found = profile_problems(settings)
    if found:
        raise ConfigurationError(cannot_start(settings, found))


def cannot_start(settings: Settings, problems: list[str]) -> str:
    """The refusal of a process that has ``problems``: one line, or one line each."""
    if len(problems) == 1:
        return f"the {settings.profile} profile cannot start: {problems[0]}"
    listed = "\n".join(f"- {p}" for p in problems)
    return f"the {settings.profile} profile cannot start:\n{listed}"


def _missing(name: str, what: str) -> str:
    setting = variable(name)
    return f"{setting} is not set: {what} (or {setting}_FILE, a file that holds it)"


def url_problems(settings: Settings) -> list[str]:
    """Each URL setting that is set but cannot be used, as the process would read it."""
    found = [
        _database_url_problem(settings.database_url) if settings.database_url else None,
        _redis_url_problem(settings.redis_url) if settings.redis_url else None,
        _url_problem("bridge_url", settings.bridge_url, BRIDGE_SCHEMES)
        if settings.bridge_url
        else None,
        _url_problem("jwt_jwks_url", settings.jwt_jwks_url, JWKS_SCHEMES)
        if settings.jwt_jwks_url
        else None,
    ]
    return [problem for problem in found if problem]


def key_setting_problems(settings: Settings) -> list[str]:
    """Key settings that contradict each other: one of them would be ignored without a word,
    so which one the operator meant is asked instead."""
    key_set = settings.jwt_jwks_file is not None or bool(settings.jwt_jwks_url)
    algorithm = settings.jwt_algorithm
    found = []
    checked_by = (
        "a key set (SECKILL_JWT_JWKS_FILE or SECKILL_JWT_JWKS_URL), which alone checks tokens"
        if key_set
        else f"SECKILL_JWT_ALGORITHM is {algorithm}"
    )
    if settings.jwt_secret and (key_set or algorithm != "HS256"):
        found.append(
            f"SECKILL_JWT_SECRET is set beside {checked_by}: unset one (an HS256 key of a key "
            "set is published in the set)"
        )
    if settings.jwt_public_key_file is not None and (key_set or algorithm == "HS256"):
        found.append(f"SECKILL_JWT_PUBLIC_KEY_FILE is set beside {checked_by}: unset one")
    if settings.jwt_private_key_file is not None and not key_set and algorithm == "HS256":
        found.append(
            "SECKILL_JWT_PRIVATE_KEY_FILE is set, but SECKILL_JWT_ALGORITHM is HS256, which "
            "signs with SECKILL_JWT_SECRET: unset one"
        )
    return found


def _database_url_problem(url: str) -> str | None:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    variable = f"{ENV_PREFIX}DATABASE_URL"
    shown = mask_url(url)
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return (
            f"{variable} ({shown}) is not a database URL: driver://user:password@host:port/"
            "database, the port a number (e.g. postgresql+asyncpg://seckill:...@db:5432/seckill)"
        )
    drivers = "postgresql+asyncpg://, mysql+asyncmy:// or sqlite+aiosqlite://"
    try:
        dialect = parsed.get_dialect()
        dialect.import_dbapi()
    except (NoSuchModuleError, ImportError):
        return f"{variable} ({shown}) names the driver {parsed.drivername!r}, which is unknown or not installed: use {drivers}"  # noqa: E501
    if not dialect.is_async:
        return f"{variable} ({shown}) names {parsed.drivername!r}, which is not an asyncio driver: use {drivers}"  # noqa: E501
    return None


def _redis_url_problem(url: str) -> str | None:
    from redis.connection import parse_url

    problem = _url_problem("redis_url", url, REDIS_SCHEMES)
    if problem:
        return problem
    try:
        parse_url(url)  # type: ignore[no-untyped-call]
    except ValueError as exc:
        return f"{ENV_PREFIX}REDIS_URL ({mask_url(url)}) is not a Redis URL: {exc}"
    database = urlsplit(url).path.strip("/")
    if urlsplit(url).scheme != "unix" and database and not database.isdigit():
        return (
            f"{ENV_PREFIX}REDIS_URL ({mask_url(url)}) names the database {database!r}: a Redis "
            "database is a number (redis://host:6379/0)"
        )
    return None


def _url_problem(setting: str, url: str, schemes: tuple[str, ...]) -> str | None:
    """A URL of one of ``schemes`` with a host (unix: a path) and, if any, a numeric port."""
    variable = f"{ENV_PREFIX}{setting.upper()}"
    shown = mask_url(url)
    known = ", ".join(f"{scheme}://" for scheme in schemes)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsed here: a port that is not a number raises
    except ValueError as exc:
        return f"{variable} ({shown}) is not a URL: {exc}"
    scheme = parts.scheme.lower()
    if scheme not in schemes:
        return f"{variable} ({shown}) is not a URL this setting takes: it must start with {known}"
    if scheme != "unix" and not parts.hostname:
        return f"{variable} ({shown}) names no host"
    return None


def _token_keys_set(settings: Settings) -> bool:
    return bool(
        settings.jwt_secret
        or settings.jwt_jwks_file
        or settings.jwt_jwks_url
        or settings.jwt_algorithm != "HS256"
    )
