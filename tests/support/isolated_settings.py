"""Settings for a test of keys and secrets, whatever SECKILL_* variables the machine exports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from seckill.config import Settings


def isolated_settings(tmp_path: Path, **overrides: Any) -> Settings:
    """Settings on ``tmp_path`` with every key and secret empty (generated) unless overridden:
    explicit values win over the SECKILL_* variables a developer may have exported."""
    defaults: dict[str, Any] = {
        "data_dir": tmp_path,
        "jwt_algorithm": "HS256",
        "jwt_secret": "",
        "jwt_private_key_file": None,
        "jwt_public_key_file": None,
        "jwt_jwks_file": None,
        "jwt_jwks_url": "",
        "jwt_signing_kid": "",
        "payment_secret": "",
        "ticket_secret": "",
    }
    return Settings(**(defaults | overrides))
