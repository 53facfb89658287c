"""Every ``SECKILL_*`` name the README, docs/ and deploy/ mention is a setting that exists.

A name is a setting when ``Settings`` reads it: ``SECKILL_`` and a field of
``Settings.model_fields`` in upper case (pydantic-settings' env prefix, no aliases), or the
``_FILE`` twin of a secret setting (``SECRET_SETTINGS``, read by ``SecretFiles``). Anything else
must be on ``NOT_SETTINGS`` below, each entry naming the file that really reads or defines it, so
that a name a page invents (or one a rename left behind) fails here, and so does an entry of the
list once that file stops naming it.
"""

from __future__ import annotations

import re
from pathlib import Path

from seckill.config import SECRET_SETTINGS, Settings
from seckill.domain.configuration import ENV_PREFIX

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"SECKILL_[A-Z0-9_]+")

# Names that are not settings and still belong in the pages, each with the file that reads or
# defines it (relative to the repository's root).
NOT_SETTINGS = {
    # The servers the SQL and broker suites also run on (each suite skips without its URL).
    "SECKILL_TEST_POSTGRES_URL": "tests/conftest.py",
    "SECKILL_TEST_MARIADB_URL": "tests/conftest.py",
    "SECKILL_TEST_AMQP_URL": "tests/support/brokers.py",
    "SECKILL_TEST_NATS_URL": "tests/support/brokers.py",
    # `seckill demo` and `seckill bench`'s --admin-token, from the environment (typer's envvar).
    "SECKILL_ADMIN_TOKEN": "src/seckill/cli/rehearsals.py",
    # The example clients' token and API address (docs/api.md runs them).
    "SECKILL_TOKEN": "examples/buyer.py",
    "SECKILL_URL": "examples/buyer.py",
    # The NATS JetStream stream the bridge publishes to by default: a name, not a variable.
    "SECKILL_ORDERS": "src/seckill/sinks/nats.py",
    # compose's own variable: the image every service runs (`${SECKILL_IMAGE:-seckill:latest}`).
    "SECKILL_IMAGE": "deploy/compose.yaml",
}


def settings_names() -> set[str]:
    names = {f"{ENV_PREFIX}{name.upper()}" for name in Settings.model_fields}
    twins = {f"{ENV_PREFIX}{name.upper()}_FILE" for name in SECRET_SETTINGS}
    return names | twins


def pages() -> list[Path]:
    """The README, every page under docs/ and every file under deploy/ (all text)."""
    deploy = [path for path in sorted((ROOT / "deploy").rglob("*")) if path.is_file()]
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *deploy]


def test_the_secret_settings_are_settings() -> None:
    # Else a twin below would be a name no code reads.
    assert set(SECRET_SETTINGS) <= set(Settings.model_fields)


def test_every_seckill_name_in_the_docs_and_deploy_is_a_setting() -> None:
    known = settings_names() | NOT_SETTINGS.keys()
    unknown = sorted(
        f"{page.relative_to(ROOT)}:{line}: {name}"
        for page in pages()
        for line, text in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        for name in NAME.findall(text)
        if name not in known
    )
    assert not unknown, (
        "not a setting of seckill.config.Settings (nor a _FILE twin of a secret one, nor on "
        f"NOT_SETTINGS): {unknown}"
    )


def test_every_name_that_is_not_a_setting_is_read_where_the_list_says() -> None:
    stale = [
        f"{name}: not in {path}"
        for name, path in NOT_SETTINGS.items()
        if name not in (ROOT / path).read_text(encoding="utf-8")
    ]
    assert not stale, stale
    overlap = sorted(NOT_SETTINGS.keys() & settings_names())
    assert not overlap, f"settings now, to take off NOT_SETTINGS: {overlap}"
