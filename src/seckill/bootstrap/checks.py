"""Every check a process makes of its settings before it starts anything, in one list: what
the profile asks for (``Settings.problems``), then whether what is set can be used (the TLS
files, the key lists, the token keys), each read as the process would read it."""

from __future__ import annotations

from collections.abc import Callable

from seckill.config import Settings
from seckill.security.signatures import payment_secret
from seckill.security.tickets import ticket_secret
from seckill.security.tokens import token_codec
from seckill.tls import database_ssl_context, redis_ssl_options


def configuration_problems(settings: Settings) -> list[str]:
    """One line per problem (none: the process can start). Reads the files the settings name
    and, with SECKILL_JWT_JWKS_URL, fetches the key set; generates nothing: a key left unset is
    checked only where the profile asks for it."""
    problems = settings.problems()
    checks: list[Callable[[], object]] = [
        lambda: redis_ssl_options(settings),
        lambda: database_ssl_context(settings),
    ]
    if settings.ticket_secret:
        checks.append(lambda: ticket_secret(settings))
    if settings.payment_secret:
        checks.append(lambda: payment_secret(settings))
    if not settings.token_key_problems() and _token_keys_set(settings):
        checks.append(lambda: token_codec(settings))
    for check in checks:
        try:
            check()
        except (ValueError, OSError) as exc:  # ConfigurationError is a ValueError
            problems.append(str(exc))
    return problems


def _token_keys_set(settings: Settings) -> bool:
    return bool(
        settings.jwt_secret
        or settings.jwt_jwks_file
        or settings.jwt_jwks_url
        or settings.jwt_algorithm != "HS256"
    )
