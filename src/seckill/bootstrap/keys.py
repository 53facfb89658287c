"""The keys every process works with, read from the settings: the one place that reads a key
setting. What reads them below gets the keys themselves (``seckill.security``).

- the secret settings (``SECKILL_<NAME>_SECRET``): one key or several separated by commas, the
  first signs and every one verifies, so a key rotates without refusing anyone; left unset in
  the embedded profile, one is generated once into the data directory;
- the tokens' codec: a key set (a file, or a URL fetched now and refreshed in the background),
  or one pinned algorithm (an HS256 secret, or a PEM public key with its private key to mint);
- what a crowd needs to act for everyone (``credentials``).

Every refusal names the setting at fault.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, overload

from seckill.config import Settings
from seckill.domain.configuration import ENV_PREFIX, ConfigurationError, variable
from seckill.security.generated import generated_secret
from seckill.security.jwks import MIN_HMAC_KEY_BYTES, JwksSource
from seckill.security.key_refresh import JwksRefresher, refreshing
from seckill.security.signed import MIN_KEY_BYTES
from seckill.security.tokens import TokenCodec

if TYPE_CHECKING:
    from seckill.crowd.client import Credentials

_PRIVATE_KEY_FILE = variable("jwt_private_key_file")
_PUBLIC_KEY_FILE = variable("jwt_public_key_file")


def secret_or_generated(settings: Settings, name: str) -> str:
    """The secret setting ``<name>_secret``: configured, or (embedded profile only) generated
    once into the data directory. The production profile generates nothing: an unset secret
    there is a ``ConfigurationError``."""
    value: str = getattr(settings, f"{name}_secret")
    if value:
        return value
    if settings.profile == "production":
        setting = variable(f"{name}_secret")
        raise ConfigurationError(f"{setting} is not set (the production profile generates none)")
    return generated_secret(settings.data_dir, name)


def secret_keys(settings: Settings, name: str, *, min_bytes: int = 1) -> tuple[str, ...]:
    """The keys of the secret setting ``<name>_secret`` (see ``secret_or_generated``): one key,
    or several separated by commas. The first signs, every one verifies, so a key rotates
    without refusing anyone: add the new one second, make it first, drop the old one.

    Raises ``ConfigurationError`` (a ``ValueError``), naming the setting, for an empty key (as
    in ``a,,b``) or a key shorter than ``min_bytes``.
    """
    keys = tuple(key.strip() for key in secret_or_generated(settings, name).split(","))
    setting = variable(f"{name}_secret")
    for number, key in enumerate(keys, start=1):
        if not key:
            raise ConfigurationError(
                f"{setting}: key {number} of {len(keys)} is empty (keys are separated by "
                "single commas, none before the first or after the last)"
            )
        if len(key.encode()) < min_bytes:
            raise ConfigurationError(
                f"{setting}: key {number} of {len(keys)} has {len(key.encode())} bytes; "
                f"each needs at least {min_bytes}"
            )
    return keys


def payment_secret(settings: Settings) -> tuple[bytes, ...]:
    """The HMAC keys shared with the payment provider, the signing one first: configured, or
    one generated once. Raises ``ValueError`` naming the setting for an empty key or one
    shorter than ``MIN_KEY_BYTES`` (a short key is guessed offline from one signed notice)."""
    return tuple(key.encode() for key in secret_keys(settings, "payment", min_bytes=MIN_KEY_BYTES))


def ticket_secret(settings: Settings) -> tuple[bytes, ...]:
    """The HMAC keys of tickets and queue passes, the signing one first: configured, or one
    generated once into the data directory. Raises ``ValueError`` naming the setting for an
    empty key or one shorter than ``MIN_KEY_BYTES``."""
    return tuple(key.encode() for key in secret_keys(settings, "ticket", min_bytes=MIN_KEY_BYTES))


def jwks_source(settings: Settings) -> JwksSource | None:
    """The key set the settings name, or None (tokens are checked with one pinned key).
    ``ValueError`` when both a file and a URL are named."""
    file_setting, url_setting = variable("jwt_jwks_file"), variable("jwt_jwks_url")
    if settings.jwt_jwks_file is not None and settings.jwt_jwks_url:
        raise ValueError(f"both {file_setting} and {url_setting} are set: keep one")
    if settings.jwt_jwks_file is not None:
        return JwksSource(setting=file_setting, file=settings.jwt_jwks_file)
    if settings.jwt_jwks_url:
        return JwksSource(setting=url_setting, url=settings.jwt_jwks_url)
    return None


def token_codec(settings: Settings) -> TokenCodec:
    """The codec the settings describe: a key set (read or fetched now), or one pinned
    algorithm (HS256 secret generated into the data dir if unset). Raises ``ValueError``
    naming the setting at fault."""
    private_file = settings.jwt_private_key_file
    source = jwks_source(settings)
    if source is not None:
        return TokenCodec.from_key_set(
            source.load(),
            signing_kid=settings.jwt_signing_kid or None,
            signing_key=_key_file(private_file, _PRIVATE_KEY_FILE),
            issuer=settings.jwt_issuer,
            audience=settings.jwt_audience,
        )
    if settings.jwt_algorithm == "HS256":
        keys = secret_keys(settings, "jwt", min_bytes=MIN_HMAC_KEY_BYTES)
        return TokenCodec(
            algorithm="HS256",
            signing_key=keys[0],
            verify_key=keys,
            issuer=settings.jwt_issuer,
            audience=settings.jwt_audience,
        )
    if settings.jwt_public_key_file is None:
        raise ValueError(f"{settings.jwt_algorithm} needs {_PUBLIC_KEY_FILE} (a PEM public key)")
    try:
        return TokenCodec(
            algorithm=settings.jwt_algorithm,
            signing_key=_key_file(private_file, _PRIVATE_KEY_FILE),
            verify_key=_key_file(settings.jwt_public_key_file, _PUBLIC_KEY_FILE),
            issuer=settings.jwt_issuer,
            audience=settings.jwt_audience,
        )
    except ValueError as error:
        if str(error).startswith(ENV_PREFIX):
            raise  # a file that cannot be read, named already
        named = (
            _PUBLIC_KEY_FILE
            if private_file is None
            else f"{_PUBLIC_KEY_FILE} and {_PRIVATE_KEY_FILE}"
        )
        raise ValueError(f"{named}: {error}") from None


@overload
def _key_file(path: Path, setting: str) -> bytes: ...
@overload
def _key_file(path: None, setting: str) -> None: ...
def _key_file(path: Path | None, setting: str) -> bytes | None:
    """The PEM file a setting names, read; ``ValueError`` naming the setting if it cannot be."""
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as error:
        raise ValueError(
            f"{setting} names {path}, which cannot be read: {error.strerror}"
        ) from None


def refreshing_keys(
    codec: TokenCodec, settings: Settings
) -> contextlib.AbstractAsyncContextManager[JwksRefresher | None]:
    """While open, ``codec``'s key set is loaded again in the background, when the settings
    name one (else this does nothing)."""
    return refreshing(
        codec, jwks_source(settings), interval_seconds=settings.jwt_jwks_refresh_seconds
    )


def crowd_credentials(settings: Settings, *, admin_token: str | None = None) -> Credentials:
    """What a crowd needs to act for everyone, from the deployment's own keys as its settings
    name them (``SECKILL_JWT_*``, ``SECKILL_PAYMENT_SECRET``, or those generated into
    ``SECKILL_DATA_DIR``)."""
    tokens = token_codec(settings)
    if not tokens.can_mint:
        raise ValueError(
            f"buyer tokens need the signing key: set {_PRIVATE_KEY_FILE} (with a key set, "
            f"{variable('jwt_signing_kid')} too)"
        )
    from seckill.crowd.client import Credentials  # aiohttp: only a crowd's process needs it

    # A provider signs with one key: the first, as SECKILL_PAYMENT_SECRET orders them.
    signing = payment_secret(settings)[0]
    return Credentials(tokens=tokens, payment_secret=signing, admin_token=admin_token)
