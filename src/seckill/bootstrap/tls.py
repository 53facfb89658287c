"""TLS to Redis and to SQL, the client's side, from the settings (docs/operations/tls.md).

Redis speaks TLS when its URL is ``rediss://`` (one Redis, or a node of a cluster). Every
connection to it (redis-py's clients, the purchase path's pipelined connections, those of each
cluster node) then checks the server's certificate against SECKILL_REDIS_TLS_CA_FILE, and the
host it names unless SECKILL_REDIS_TLS_CHECK_HOSTNAME is false, and shows the client
certificate when one is set. SQL speaks TLS when SECKILL_DATABASE_TLS says how strictly.

One rule builds every context: ``client_context``, as redis-py builds its own from the same
options (``ssl.create_default_context()``, then the CA file and the client's pair): the CA file
is trusted besides the system's CAs. redis-py's clients take files rather than a context, so
the Redis side is given as redis-py's ``ssl_*`` options, checked here by building a context from
them. Files are checked when the runtime opens, before anything connects: a missing file, a CA
file that holds no certificate and a certificate without its key are refused, naming the
setting.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from seckill.config import Settings
from seckill.domain.configuration import ENV_PREFIX, ConfigurationError


def client_context(
    *,
    ca_file: Path | None,
    cert_file: Path | None,
    key_file: Path | None,
    verify: bool = True,
    check_hostname: bool = True,
    settings_prefix: str,
) -> ssl.SSLContext:
    """A client's TLS context: the server's certificate checked against ``ca_file`` and the
    system's CAs (not at all when not ``verify``), the host it names too when
    ``check_hostname``; ``cert_file`` and ``key_file`` shown to the server when set.

    ``settings_prefix`` (``redis_tls``, ``database_tls``) names the settings in the errors."""
    context = ssl.create_default_context()  # TLS 1.2 or later, CERT_REQUIRED, the system's CAs
    if verify:
        context.check_hostname = check_hostname
    else:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if ca_file is not None:
        _exists(ca_file, f"{settings_prefix}_ca_file")
        try:
            context.load_verify_locations(cafile=ca_file)
        except ssl.SSLError:
            raise ConfigurationError(
                f"{_variable(f'{settings_prefix}_ca_file')} names {ca_file}, "
                "which holds no PEM certificate"
            ) from None
        except OSError as exc:
            raise ConfigurationError(
                f"{_variable(f'{settings_prefix}_ca_file')} names {ca_file}, "
                f"which cannot be read: {exc.strerror}"
            ) from None
    cert, key = f"{settings_prefix}_cert_file", f"{settings_prefix}_key_file"
    if (cert_file is None) != (key_file is None):
        given, missing = (cert, key) if key_file is None else (key, cert)
        raise ConfigurationError(
            f"{_variable(given)} is set without {_variable(missing)}: a client certificate "
            "needs its private key (set both, or neither)"
        )
    if cert_file is not None and key_file is not None:
        _exists(cert_file, cert)
        _exists(key_file, key)
        try:
            context.load_cert_chain(cert_file, key_file)
        except ssl.SSLError as exc:
            raise ConfigurationError(
                f"{_variable(cert)} and {_variable(key)} ({cert_file}, {key_file}) are not a PEM "
                f"certificate and its private key: {exc.reason or exc}"
            ) from None
        except OSError as exc:
            raise ConfigurationError(
                f"{_variable(cert)} or {_variable(key)} ({cert_file}, {key_file}) "
                f"cannot be read: {exc.strerror}"
            ) from None
    return context


def redis_ssl_options(settings: Settings) -> dict[str, Any]:
    """redis-py's ``ssl_*`` options for a ``rediss://`` SECKILL_REDIS_URL (its files checked);
    none for any other URL. A query option of the URL's own (``?ssl_...``) wins, as in
    redis-py, on every connection alike."""
    files = {
        "redis_tls_ca_file": settings.redis_tls_ca_file,
        "redis_tls_cert_file": settings.redis_tls_cert_file,
        "redis_tls_key_file": settings.redis_tls_key_file,
    }
    if not settings.redis_url.startswith("rediss://"):
        given = [name for name, path in files.items() if path is not None]
        if given:
            raise ConfigurationError(
                f"{_variable(given[0])} is set, but SECKILL_REDIS_URL is not a rediss:// URL "
                "(TLS to Redis is turned on by a rediss:// URL)"
            )
        return {}
    client_context(  # only to check the files now, as every connection will read them
        ca_file=settings.redis_tls_ca_file,
        cert_file=settings.redis_tls_cert_file,
        key_file=settings.redis_tls_key_file,
        check_hostname=settings.redis_tls_check_hostname,
        settings_prefix="redis_tls",
    )
    options: dict[str, Any] = {
        "ssl_cert_reqs": "required",
        "ssl_check_hostname": settings.redis_tls_check_hostname,
    }
    names = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
    for option, path in zip(names, files.values(), strict=True):
        if path is not None:
            options[option] = str(path)
    return options


def database_ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """The TLS context of SQL connections, as SECKILL_DATABASE_TLS says; None when it is empty
    (the URL's options and the driver's defaults then apply)."""
    mode = settings.database_tls
    files = {
        "database_tls_ca_file": settings.database_tls_ca_file,
        "database_tls_cert_file": settings.database_tls_cert_file,
        "database_tls_key_file": settings.database_tls_key_file,
    }
    given = [name for name, path in files.items() if path is not None]
    if not mode:
        if given:
            raise ConfigurationError(
                f"{_variable(given[0])} is set, but SECKILL_DATABASE_TLS is not: set it to "
                "require, verify-ca or verify-full"
            )
        return None
    if make_url(settings.effective_database_url).get_backend_name() == "sqlite":
        raise ConfigurationError(
            f"SECKILL_DATABASE_TLS is {mode}, but the database is a SQLite file: "
            "there is no connection to encrypt"
        )
    if mode == "require" and settings.database_tls_ca_file is not None:
        raise ConfigurationError(
            "SECKILL_DATABASE_TLS_CA_FILE is set, but SECKILL_DATABASE_TLS is require, which "
            "checks no certificate: use verify-ca or verify-full"
        )
    return client_context(
        ca_file=settings.database_tls_ca_file,
        cert_file=settings.database_tls_cert_file,
        key_file=settings.database_tls_key_file,
        verify=mode != "require",
        check_hostname=mode == "verify-full",
        settings_prefix="database_tls",
    )


def _exists(path: Path, setting: str) -> None:
    if not path.is_file():
        raise ConfigurationError(f"{_variable(setting)} names {path}, which is not a file")


def _variable(setting: str) -> str:
    return ENV_PREFIX + setting.upper()


def database_tls_refusal(exc: BaseException) -> str | None:
    """What to tell the operator when ``exc`` (raised connecting to SQL) is a TLS handshake
    that failed: the server speaks no TLS, or its certificate was refused. That is no outage to
    wait out but a setting to fix, so a process stops on it (exit 2). None for anything else."""
    mode = "SECKILL_DATABASE_TLS"
    for cause in _chain(exc):
        text = str(cause)
        if isinstance(cause, ssl.SSLCertVerificationError):
            return (
                f"the database's certificate was refused ({cause.verify_message}): check "
                f"{mode}_CA_FILE, or {mode} (verify-ca does not check the host it names)"
            )
        if isinstance(cause, ssl.SSLError) or "rejected SSL upgrade" in text:
            # asyncpg: 'PostgreSQL server at "host:port" rejected SSL upgrade'.
            return (
                f"the database refused TLS ({text or type(cause).__name__}): turn TLS on at "
                f"the server, or leave {mode} unset where the server speaks none"
            )
    return None


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc``, what SQLAlchemy wraps in it (``orig``) and its causes, each once."""
    found: list[BaseException] = []
    pending: list[object] = [exc]
    while pending:
        cause = pending.pop()
        if not isinstance(cause, BaseException) or any(cause is seen for seen in found):
            continue
        found.append(cause)
        pending += [getattr(cause, "orig", None), cause.__cause__, cause.__context__]
    return found
