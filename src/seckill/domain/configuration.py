"""How a setting is named where an operator sets it, and the error a setting that cannot run
raises: shared by the settings (``seckill.config``) and by the code below them that names a
setting in a refusal without reading any."""

from __future__ import annotations

ENV_PREFIX = "SECKILL_"


def variable(name: str) -> str:
    """The environment variable of the setting ``name`` (``jwt_secret``: ``SECKILL_JWT_SECRET``)."""
    return ENV_PREFIX + name.upper()


class ConfigurationError(ValueError):
    """The settings cannot run this process; the message names every setting at fault."""
