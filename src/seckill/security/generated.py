"""Secrets generated once into the data directory, so every local process agrees on them (the
embedded profile only).

Used when a secret setting is left empty: ``seckill serve`` and ``seckill token`` started on a
fresh machine must share one key without anyone configuring it. Production sets the secrets.
"""

from __future__ import annotations

import os
import re
import secrets
import tempfile
from pathlib import Path

from seckill.config import ENV_PREFIX, ConfigurationError, Settings

_NAME = re.compile(r"[a-z0-9_-]{1,64}")


def secret_or_generated(settings: Settings, name: str) -> str:
    """The secret setting ``<name>_secret``: configured, or (embedded profile only) generated
    once into the data directory. The production profile generates nothing: an unset secret
    there is a ``ConfigurationError``."""
    value: str = getattr(settings, f"{name}_secret")
    if value:
        return value
    if settings.profile == "production":
        variable = f"{ENV_PREFIX}{name.upper()}_SECRET"
        raise ConfigurationError(f"{variable} is not set (the production profile generates none)")
    return generated_secret(settings.data_dir, name)


def secret_keys(settings: Settings, name: str, *, min_bytes: int = 1) -> tuple[str, ...]:
    """The keys of the secret setting ``<name>_secret`` (see ``secret_or_generated``): one key,
    or several separated by commas. The first signs, every one verifies, so a key rotates
    without refusing anyone: add the new one second, make it first, drop the old one.

    Raises ``ConfigurationError`` (a ``ValueError``), naming the setting, for an empty key (as
    in ``a,,b``) or a key shorter than ``min_bytes``.
    """
    keys = tuple(key.strip() for key in secret_or_generated(settings, name).split(","))
    variable = f"{ENV_PREFIX}{name.upper()}_SECRET"
    for number, key in enumerate(keys, start=1):
        if not key:
            raise ConfigurationError(
                f"{variable}: key {number} of {len(keys)} is empty (keys are separated by "
                "single commas, none before the first or after the last)"
            )
        if len(key.encode()) < min_bytes:
            raise ConfigurationError(
                f"{variable}: key {number} of {len(keys)} has {len(key.encode())} bytes; "
                f"each needs at least {min_bytes}"
            )
    return keys


def generated_secret(data_dir: Path, name: str) -> str:
    """The secret stored in ``data_dir/secrets/<name>``, created on first use.

    A new secret is 32 random bytes, URL-safe base64. Processes racing on a fresh directory all
    get the one value that was written first. Raises ``ValueError`` if the file is empty.
    """
    if not _NAME.fullmatch(name):
        # The name becomes a file name: no separators, no dots, nothing that leaves the directory.
        raise ValueError(f"secret name must match {_NAME.pattern}, got {name!r}")
    directory = data_dir / "secrets"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / name
    if not path.exists():
        _create(path, secrets.token_urlsafe(32))
    value = path.read_text(encoding="utf-8").strip()
    if not value:
        raise ValueError(
            f"the secret file {path} is empty: write a secret into it, or delete it to have "
            "a new one generated (tokens and signatures made with the old one stop working)"
        )
    return value


def _create(path: Path, value: str) -> None:
    # The value is written completely to a private temporary file first, then linked into place:
    # os.link fails if the name exists, so exactly one process wins, and no reader ever sees a
    # half-written file (as it could between O_EXCL's create and its write). Losers simply read
    # the winner's file.
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(value + "\n")
            file.flush()
            # On disk before the name exists, so a crash cannot leave an empty secret behind.
            os.fsync(file.fileno())
        try:
            os.link(temporary, path)
        except FileExistsError:
            return
        _fsync_directory(path.parent)
    finally:
        os.unlink(temporary)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
