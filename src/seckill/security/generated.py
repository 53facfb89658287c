"""Secrets generated once into the data directory, so every local process agrees on them (the
embedded profile only).

Used when a secret setting is left empty (``seckill.bootstrap.keys``): ``seckill serve`` and
``seckill token`` started on a fresh machine must share one key without anyone configuring it.
Production sets the secrets.
"""

from __future__ import annotations

import os
import re
import secrets
import tempfile
from pathlib import Path

_NAME = re.compile(r"[a-z0-9_-]{1,64}")


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
