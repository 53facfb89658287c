"""The production profile: no embedded Redis, no SQLite default, no generated key; secrets from
files; `seckill config check` for a deploy pipeline."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from seckill.bootstrap.checks import profile_problems, require_runnable
from seckill.bootstrap.keys import secret_or_generated, token_codec
from seckill.cli.settings import masked
from seckill.config import Settings
from seckill.domain.configuration import ConfigurationError

# Everything the production profile asks for, each given.
COMPLETE = {
    "SECKILL_PROFILE": "production",
    "SECKILL_REDIS_URL": "redis://10.0.0.5:6379/0",
    "SECKILL_DATABASE_URL": "postgresql+asyncpg://seckill:hunter2@10.0.0.6/seckill",
    "SECKILL_JWT_SECRET": "j" * 32,
    "SECKILL_TICKET_SECRET": "t" * 32,
    "SECKILL_PAYMENT_SECRET": "p" * 32,
}


def clean_env(tmp_path: Path, **variables: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SECKILL_")}
    return env | {"SECKILL_DATA_DIR": str(tmp_path / "data"), "COLUMNS": "250"} | variables


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """The test's own SECKILL_* variables only (none a developer exported), no .env read."""
    for name in list(os.environ):
        if name.startswith("SECKILL_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SECKILL_DATA_DIR", str(tmp_path / "data"))
    return monkeypatch


def test_the_embedded_profile_needs_nothing(environment: pytest.MonkeyPatch) -> None:
    settings = Settings()
    assert settings.profile == "embedded"
    assert profile_problems(settings) == []
    require_runnable(settings)


@pytest.mark.parametrize("missing", sorted(set(COMPLETE) - {"SECKILL_PROFILE"}))
def test_production_names_each_missing_setting(
    environment: pytest.MonkeyPatch, missing: str
) -> None:
    for name, value in COMPLETE.items():
        if name != missing:
            environment.setenv(name, value)
    problems = profile_problems(Settings())
    assert len(problems) == 1
    assert problems[0].startswith(f"{missing} is not set")
    assert f"{missing}_FILE" in problems[0]
    with pytest.raises(ConfigurationError, match=missing):
        require_runnable(Settings())


def test_production_starts_when_everything_is_set(environment: pytest.MonkeyPatch) -> None:
    for name, value in COMPLETE.items():
        environment.setenv(name, value)
    settings = Settings()
    assert profile_problems(settings) == []
    require_runnable(settings)
    assert token_codec(settings).can_mint


def test_production_generates_no_key(environment: pytest.MonkeyPatch, tmp_path: Path) -> None:
    environment.setenv("SECKILL_PROFILE", "production")
    with pytest.raises(ConfigurationError, match="SECKILL_TICKET_SECRET"):
        secret_or_generated(Settings(), "ticket")
    assert not (tmp_path / "data" / "secrets").exists()


@pytest.mark.parametrize("algorithm", ["RS256", "ES256"])
def test_rs256_and_es256_in_production_need_the_public_key(
    environment: pytest.MonkeyPatch, algorithm: str
) -> None:
    for name, value in COMPLETE.items():
        environment.setenv(name, value)
    environment.setenv("SECKILL_JWT_ALGORITHM", algorithm)
    environment.delenv("SECKILL_JWT_SECRET")
    problems = profile_problems(Settings())
    assert [p.split(" ")[0] for p in problems] == ["SECKILL_JWT_PUBLIC_KEY_FILE"]
    assert "SECKILL_JWT_JWKS_FILE" in problems[0]


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SECKILL_JWT_JWKS_FILE", "/etc/seckill/jwks.json"),
        ("SECKILL_JWT_JWKS_URL", "https://id.example.com/.well-known/jwks.json"),
    ],
)
@pytest.mark.parametrize("algorithm", ["HS256", "RS256"])
def test_a_key_set_verifies_tokens_in_production(
    environment: pytest.MonkeyPatch, variable: str, value: str, algorithm: str
) -> None:
    for name, set_to in COMPLETE.items():
        environment.setenv(name, set_to)
    environment.delenv("SECKILL_JWT_SECRET")
    environment.setenv("SECKILL_JWT_ALGORITHM", algorithm)
    environment.setenv(variable, value)
    assert profile_problems(Settings()) == []


def test_secrets_are_read_from_files(environment: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "db").write_text("postgresql+asyncpg://u:pw@db/seckill\n")
    (tmp_path / "jwt").write_text("a-key-from-a-mounted-secret-file-32\n")
    environment.setenv("SECKILL_DATABASE_URL_FILE", str(tmp_path / "db"))
    environment.setenv("SECKILL_JWT_SECRET_FILE", str(tmp_path / "jwt"))
    settings = Settings()
    assert settings.database_url == "postgresql+asyncpg://u:pw@db/seckill"
    assert settings.jwt_secret == "a-key-from-a-mounted-secret-file-32"


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"SECKILL_JWT_SECRET": "x" * 32, "SECKILL_JWT_SECRET_FILE": "jwt"}, "both"),
        ({"SECKILL_JWT_SECRET_FILE": "absent"}, "cannot be read"),
        ({"SECKILL_JWT_SECRET_FILE": "empty"}, "is empty"),
    ],
)
def test_a_secret_file_that_cannot_be_used_is_refused(
    environment: pytest.MonkeyPatch, tmp_path: Path, variables: dict[str, str], message: str
) -> None:
    (tmp_path / "jwt").write_text("x" * 32)
    (tmp_path / "empty").write_text("\n")
    for name, value in variables.items():
        environment.setenv(name, value)
    with pytest.raises(ConfigurationError, match=message):
        Settings()


def test_a_file_is_only_read_for_a_secret_setting(environment: pytest.MonkeyPatch) -> None:
    environment.setenv("SECKILL_HOLD_SECONDS_FILE", "/nonexistent")
    assert Settings().hold_seconds == 300


@pytest.mark.parametrize(
    ("name", "value", "shown"),
    [
        ("database_url", "postgresql+asyncpg://u:hunter2@db:5432/s", "postgresql+asyncpg://u:***@db:5432/s"),
        ("redis_url", "rediss://:hunter2@10.0.0.5:6380/0", "rediss://:***@10.0.0.5:6380/0"),
        ("redis_url", "redis://10.0.0.5:6379/0", "redis://10.0.0.5:6379/0"),
        ("ticket_secret", "new-key,old-key", "***,***"),
        ("jwt_secret", "", ""),
        ("hold_seconds", 300, "300"),
    ],
)  # fmt: skip
def test_config_check_masks_keys_and_passwords(name: str, value: object, shown: str) -> None:
    assert masked(name, value) == shown


def config_check(tmp_path: Path, **variables: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "seckill.cli", "config", "check"],
        capture_output=True,
        text=True,
        env=clean_env(tmp_path, **variables),
        cwd=tmp_path,
        timeout=60,
    )


def test_config_check_lists_the_problems_and_exits_2(tmp_path: Path) -> None:
    done = config_check(tmp_path, SECKILL_PROFILE="production")
    assert done.returncode == 2
    problems = [line for line in done.stdout.splitlines() if line.startswith("problem:")]
    assert len(problems) == 5
    assert "SECKILL_PROFILE=production" in done.stdout


def test_config_check_passes_and_never_prints_a_secret(tmp_path: Path) -> None:
    done = config_check(tmp_path, **COMPLETE)
    assert done.returncode == 0, done.stdout
    assert "ok: the production profile can start" in done.stdout
    for secret in ("hunter2", "j" * 32, "t" * 32, "p" * 32):
        assert secret not in done.stdout


def test_a_process_in_production_refuses_to_start_without_its_settings(tmp_path: Path) -> None:
    """A worker with no Redis URL starts no Redis of its own: exit 2, each setting named,
    nothing made in the data directory."""
    done = subprocess.run(
        [sys.executable, "-m", "seckill.cli", "worker", "reaper"],
        capture_output=True,
        text=True,
        env=clean_env(tmp_path, SECKILL_PROFILE="production", SECKILL_JWT_SECRET="j" * 32),
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 2
    assert "the production profile cannot start" in done.stdout
    for name in ("REDIS_URL", "DATABASE_URL", "TICKET_SECRET", "PAYMENT_SECRET"):
        assert f"SECKILL_{name} is not set" in done.stdout
    assert "SECKILL_JWT_SECRET is not set" not in done.stdout
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(
    ("variables", "problem"),
    [
        ({"SECKILL_TICKET_SECRET": "k" * 32 + ",,"}, "SECKILL_TICKET_SECRET: key 2 of 3 is empty"),
        ({"SECKILL_PAYMENT_SECRET": ","}, "SECKILL_PAYMENT_SECRET: key 1 of 2 is empty"),
        ({"SECKILL_JWT_SECRET": "short"}, "SECKILL_JWT_SECRET: key 1 of 1 has 5 bytes"),
        ({"SECKILL_REDIS_TLS_CA_FILE": "/nonexistent/ca.pem"}, "SECKILL_REDIS_TLS_CA_FILE"),
    ],
)
def test_a_key_or_file_that_cannot_be_used_stops_a_process_in_any_profile(
    tmp_path: Path, variables: dict[str, str], problem: str
) -> None:
    """Checked as the process would use it, before it starts anything: config check lists it,
    a worker refuses to start with it (exit 2, no traceback)."""
    checked = config_check(tmp_path, **variables)
    assert checked.returncode == 2
    assert problem in checked.stdout
    started = subprocess.run(
        [sys.executable, "-m", "seckill.cli", "worker", "reaper"],
        capture_output=True,
        text=True,
        env=clean_env(tmp_path, **variables),
        cwd=tmp_path,
        timeout=60,
    )
    assert started.returncode == 2
    assert problem in started.stdout and "Traceback" not in started.stderr
    assert not (tmp_path / "data").exists()
