"""Every bad setting is one line and exit 2, before anything is created: each tried as a careless
operator would, in an empty directory, with the command a deploy runs (`db upgrade`, a worker,
`config check`, an operator's command). Nothing may be left behind: no .seckill directory, no
SQLite file, no table; no traceback; no password printed."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from sqlalchemy import text

from seckill.domain.masking import mask_url
from seckill.redis_server import RedisServer
from seckill.security.jwks import FETCH_TIMEOUT_SECONDS, JwksSource
from seckill.store.database import open_database
from tests.conftest import SERVER_URLS, RedisTarget, redis7_binary
from tests.support.brokers import free_port
from tests.support.key_sets import document, set_key

# Everything the production profile asks for, each given; the stores are never reached (port 1).
PRODUCTION = {
    "SECKILL_PROFILE": "production",
    "SECKILL_REDIS_URL": "redis://127.0.0.1:1/0",
    "SECKILL_DATABASE_URL": "postgresql+asyncpg://seckill:hunter2@127.0.0.1:1/seckill",
    "SECKILL_JWT_SECRET": "j" * 32,
    "SECKILL_TICKET_SECRET": "t" * 32,
    "SECKILL_PAYMENT_SECRET": "p" * 32,
}

# What a deploy runs first, what each host runs, and what an operator runs.
COMMANDS = [
    ("db", "upgrade"),
    ("worker", "persister"),
    ("worker", "reaper"),
    ("api", "--port", "0"),
    ("item", "list"),
    ("token", "--admin"),
    ("config", "check"),
]


def run(
    cwd: Path, *args: str, timeout: float = 60, **variables: str
) -> subprocess.CompletedProcess[str]:
    """``seckill *args`` in ``cwd`` with only ``variables`` among the SECKILL_* settings (the data
    directory left at its default, ``.seckill`` in ``cwd``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SECKILL_")}
    env |= {"COLUMNS": "400"} | variables
    return subprocess.run(
        [sys.executable, "-m", "seckill.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
    )


def refused(done: subprocess.CompletedProcess[str], *, says: str) -> str:
    """The one error line of a command that refused its settings (exit 2, no traceback)."""
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output, output
    errors = [line for line in done.stdout.splitlines() if line.startswith(("error:", "problem:"))]
    assert len(errors) == 1, output
    assert says in errors[0], output
    return errors[0]


def nothing_created(directory: Path, *, besides: tuple[str, ...] = ()) -> None:
    assert sorted(p.name for p in directory.iterdir()) == sorted(besides)


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_production_without_a_database_url_is_refused_by_every_command(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """`db upgrade` made .seckill/seckill.db and exited 0: a deploy Job that forgot the URL
    reported success."""
    settings = {k: v for k, v in PRODUCTION.items() if k != "SECKILL_DATABASE_URL"}
    refused(run(tmp_path, *command, **settings), says="SECKILL_DATABASE_URL is not set")
    nothing_created(tmp_path)


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_production_refuses_a_sqlite_database(tmp_path: Path, command: tuple[str, ...]) -> None:
    """Each host would keep a ledger of its own: refused before the file is made or migrated."""
    settings = PRODUCTION | {"SECKILL_DATABASE_URL": "sqlite+aiosqlite:///prod.db"}
    refused(run(tmp_path, *command, **settings), says="SECKILL_DATABASE_URL is a SQLite file")
    nothing_created(tmp_path)


NOT_UTF8 = b"\xff\xfe not text"

MALFORMED = [
    pytest.param(
        {"SECKILL_DATABASE_URL": "postgresql+asyncpg://seckill:hunter2@db:five432/seckill"},
        "SECKILL_DATABASE_URL (postgresql+asyncpg://seckill:***@db:five432/seckill) is not a "
        "database URL",
        id="database port not a number",
    ),
    pytest.param(
        {"SECKILL_DATABASE_URL": "postgres+asyncpgg://seckill:hunter2@db/seckill"},
        "SECKILL_DATABASE_URL (postgres+asyncpgg://seckill:***@db/seckill) names the driver "
        "'postgres+asyncpgg', which is unknown or not installed",
        id="unknown driver",
    ),
    pytest.param(
        {"SECKILL_DATABASE_URL": "postgresql://seckill@db/seckill"},
        "names the driver 'postgresql'",
        id="not an asyncio driver",
    ),
    pytest.param(
        {"SECKILL_REDIS_URL": "http://:hunter2@cache:6379/0"},
        "SECKILL_REDIS_URL (http://:***@cache:6379/0) is not a URL this setting takes: it must "
        "start with redis://, rediss://, unix://",
        id="redis over http",
    ),
    pytest.param(
        {"SECKILL_REDIS_URL": "redis://cache:63x9/0"},
        "SECKILL_REDIS_URL (redis://cache:63x9/0) is not a URL",
        id="redis port not a number",
    ),
    pytest.param(
        {"SECKILL_BRIDGE_URL": "kafka://broker:9092"},
        "SECKILL_BRIDGE_URL (kafka://broker:9092) is not a URL this setting takes",
        id="bridge scheme",
    ),
    pytest.param(
        {"SECKILL_CORS_ORIGINS": "notjson"},
        "SECKILL_CORS_ORIGINS is not JSON",
        id="cors not json",
    ),
    pytest.param(
        {"SECKILL_CORS_ORIGINS": '["shop.example"]'},
        "SECKILL_CORS_ORIGINS: Value error, 'shop.example' is not an origin",
        id="cors origin without scheme",
    ),
    pytest.param(
        {"SECKILL_DATABASE_URL_FILE": "not-utf8"},
        "SECKILL_DATABASE_URL_FILE names 'not-utf8', which is not UTF-8 text",
        id="secret file not utf-8",
    ),
    pytest.param(
        {"SECKILL_JWT_JWKS_FILE": "not-utf8"},
        "SECKILL_JWT_JWKS_FILE: the key set is not JSON",
        id="jwks file not utf-8",
    ),
    pytest.param(
        {"SECKILL_JWT_ALGORITHM": "RS256", "SECKILL_JWT_PUBLIC_KEY_FILE": "absent.pem"},
        "SECKILL_JWT_PUBLIC_KEY_FILE names absent.pem, which cannot be read",
        id="public key file absent",
    ),
    pytest.param(
        {"SECKILL_JWT_ALGORITHM": "ES256", "SECKILL_JWT_PUBLIC_KEY_FILE": "not-utf8"},
        "SECKILL_JWT_PUBLIC_KEY_FILE: the ES256 verify key is not a PEM public key",
        id="public key file not pem",
    ),
]


@pytest.mark.parametrize(("variables", "says"), MALFORMED)
@pytest.mark.parametrize("command", [("config", "check"), ("db", "upgrade"), ("worker", "reaper")])
def test_a_malformed_value_is_one_line_naming_its_setting(
    tmp_path: Path, variables: dict[str, str], says: str, command: tuple[str, ...]
) -> None:
    """They passed `config check`, then crashed with exit 1 and a traceback naming no setting."""
    (tmp_path / "not-utf8").write_bytes(NOT_UTF8)
    done = run(tmp_path, *command, **variables)
    line = refused(done, says=says)
    assert "hunter2" not in done.stdout + done.stderr, line
    nothing_created(tmp_path, besides=("not-utf8",))


@pytest.mark.parametrize(
    ("variable", "value", "secret", "shown"),
    [
        (
            "SECKILL_REDIS_URL",
            "redis://10.0.0.5:6379/0?password=hunter2-redis",
            "hunter2-redis",
            "SECKILL_REDIS_URL=redis://10.0.0.5:6379/0?password=***",
        ),
        (
            "SECKILL_BRIDGE_URL",
            "nats://s3cret-nats-token@nats:4222",
            "s3cret-nats-token",
            "SECKILL_BRIDGE_URL=nats://***@nats:4222",
        ),
        (
            "SECKILL_JWT_JWKS_URL",
            "http://idp:hunter2-jwks@127.0.0.1:1/jwks.json",
            "hunter2-jwks",
            "SECKILL_JWT_JWKS_URL=http://idp:***@127.0.0.1:1/jwks.json",
        ),
        (
            "SECKILL_DATABASE_URL",
            "postgresql+asyncpg://seckill:hunter2-sql@db:5432/seckill",
            "hunter2-sql",
            "SECKILL_DATABASE_URL=postgresql+asyncpg://seckill:***@db:5432/seckill",
        ),
    ],
)
def test_config_check_and_a_refused_start_mask_every_credential(
    tmp_path: Path, variable: str, value: str, secret: str, shown: str
) -> None:
    """The JWKS URL's fetch fails (nothing listens): its problem line shows the URL too."""
    # A problem of its own for each run, so each prints a refusal beside the settings.
    variables = {variable: value, "SECKILL_TICKET_SECRET": "short"}
    checked = run(tmp_path, "config", "check", **variables)
    assert checked.returncode == 2
    assert shown in checked.stdout.splitlines(), checked.stdout
    started = run(tmp_path, "worker", "reaper", **variables)
    assert started.returncode == 2
    for done in (checked, started):
        assert secret not in done.stdout + done.stderr, done.stdout + done.stderr
    nothing_created(tmp_path)


# The machine's PostgreSQL (the suite's, else the local one): a server this test only connects to.
POSTGRES = SERVER_URLS["postgresql"] or "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"


async def _ssl_is_off(url: str) -> bool:
    database = open_database(url)
    try:
        async with database.connect() as connection:
            return (await connection.execute(text("SHOW ssl"))).scalar() == "off"
    finally:
        await database.dispose()


@pytest.mark.redis_variants("redis7")
@pytest.mark.parametrize("command", [("db", "upgrade"), ("worker", "persister"), ("api",)])
async def test_a_database_that_refuses_tls_is_one_line_not_an_outage(
    tmp_path: Path, redis_server: RedisTarget, command: tuple[str, ...]
) -> None:
    """SECKILL_DATABASE_TLS=require against a PostgreSQL without SSL: the process started and
    ran with SQL unreachable forever. Now it stops at start, saying so."""
    if not await _ssl_is_off(POSTGRES):
        pytest.skip(f"{mask_url(POSTGRES)} speaks TLS: no server here refuses it")
    started = time.monotonic()
    done = run(
        tmp_path, *command, *(("--port", str(free_port())) if command == ("api",) else ()),
        SECKILL_DATABASE_URL=POSTGRES, SECKILL_DATABASE_TLS="require",
        SECKILL_REDIS_URL=redis_server.url,
    )  # fmt: skip
    refused(done, says="the database refused TLS (PostgreSQL server at")
    assert "SECKILL_DATABASE_TLS" in done.stdout
    assert time.monotonic() - started < 30
    nothing_created(tmp_path)


@pytest.mark.parametrize(
    "command",
    [
        *(("worker", kind) for kind in ("persister", "reaper", "reconciler", "archiver", "inlet")),
        ("worker", "bridge", "--to", "nats://127.0.0.1:1"),
        ("api", "--port", "0"),
        ("api", "--workers", "2", "--port", "0"),  # its metrics directory not made either
        ("serve", "--port", "0"),
    ],
    ids=" ".join,
)
def test_a_process_started_with_redis_down_waits_a_bounded_time_then_says_so(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """They exited 1 with a traceback at once (the API's supervisor respawned its workers)."""
    url = f"redis://:hunter2-redis@127.0.0.1:{free_port()}/0"
    started = time.monotonic()
    done = run(
        tmp_path, *command, SECKILL_REDIS_URL=url, SECKILL_REDIS_START_WAIT_SECONDS="1.5",
        SECKILL_DATABASE_URL=f"sqlite+aiosqlite:///{tmp_path}/shop.db",
    )  # fmt: skip
    elapsed = time.monotonic() - started
    refused(done, says="Redis at SECKILL_REDIS_URL (redis://:***@127.0.0.1:")
    assert "did not answer in 1.5 s" in done.stdout
    retries = [line for line in done.stderr.splitlines() if "does not answer" in line]
    assert len(retries) >= 3, done.stderr  # each failed try logged
    assert "hunter2" not in done.stdout + done.stderr
    assert 1.5 <= elapsed < 15
    nothing_created(tmp_path)


def test_a_redis_that_comes_up_during_the_wait_is_used(tmp_path: Path) -> None:
    """The retry is a real one: a Redis restarting beside the worker is waited for."""
    port = free_port()
    database = f"sqlite+aiosqlite:///{tmp_path}/shop.db"
    settings = {
        "SECKILL_REDIS_URL": f"redis://127.0.0.1:{port}/0",
        "SECKILL_DATABASE_URL": database,
        "SECKILL_REDIS_START_WAIT_SECONDS": "30",
        "SECKILL_DATA_DIR": str(tmp_path / "data"),
    }
    assert run(tmp_path, "db", "upgrade", **settings).returncode == 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("SECKILL_")} | settings
    log = tmp_path / "reaper.log"
    with log.open("w") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "seckill.cli", "worker", "reaper"],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
        )  # fmt: skip
        try:
            until(lambda: "does not answer" in log.read_text(), timeout=20)
            assert worker.poll() is None
            with RedisServer(binary=redis7_binary(), port=port):
                until(lambda: "reaper started" in log.read_text(), timeout=20)
                worker.send_signal(signal.SIGTERM)
                assert worker.wait(timeout=20) == 0, log.read_text()
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()


def until(condition: Callable[[], bool], *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_db_upgrade_against_a_silent_database_is_bounded(tmp_path: Path) -> None:
    """A server that accepts and never answers (a black hole behind a load balancer): a
    traceback after 12 s before. Now one line within the connect bound."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # the kernel completes handshakes; nobody ever answers
        port = silent.getsockname()[1]
        started = time.monotonic()
        done = run(
            tmp_path, "db", "upgrade",
            SECKILL_DATABASE_URL=f"postgresql+asyncpg://seckill:hunter2@127.0.0.1:{port}/shop",
        )  # fmt: skip
    refused(done, says="the database did not answer")
    assert time.monotonic() - started < 20
    assert "hunter2" not in done.stdout + done.stderr
    nothing_created(tmp_path)


def _revision(path: Path, new: str | None = None) -> str:
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        if new is not None:
            db.execute("UPDATE alembic_version SET version_num = ?", (new,))
        (found,) = db.execute("SELECT version_num FROM alembic_version").fetchone()
        return str(found)


def test_db_upgrade_against_a_newer_schema_says_what_to_do(tmp_path: Path) -> None:
    """A rollback: the schema was migrated by a newer release. Alembic's traceback before."""
    path = tmp_path / "shop.db"
    url = f"sqlite+aiosqlite:///{path}"
    assert run(tmp_path, "db", "upgrade", SECKILL_DATABASE_URL=url).returncode == 0
    _revision(path, "9999_from_a_newer_release")
    done = run(tmp_path, "db", "upgrade", SECKILL_DATABASE_URL=url)
    line = refused(done, says="schema is at revision 9999_from_a_newer_release, newer than")
    assert "start them without `db upgrade`" in line
    assert _revision(path) == "9999_from_a_newer_release"  # left as it was
    # The processes of this release still run on it (migrations add before they take away).
    assert run(tmp_path, "item", "list", SECKILL_DATABASE_URL=url).returncode == 0


# Keys: too short, contradictory, leaked.

RSA = set_key("rsa-1", "RS256")


@pytest.mark.parametrize(
    ("variables", "says"),
    [
        pytest.param(
            {"SECKILL_PAYMENT_SECRET": "k"},
            "SECKILL_PAYMENT_SECRET: key 1 of 1 has 1 bytes; each needs at least 32",
            id="one-byte payment key",
        ),
        pytest.param(
            {"SECKILL_PAYMENT_SECRET": "p" * 32 + "," + "p" * 31},
            "SECKILL_PAYMENT_SECRET: key 2 of 2 has 31 bytes",
            id="short payment key in a rotation",
        ),
        pytest.param(
            {"SECKILL_JWT_SECRET": "j" * 31},
            "SECKILL_JWT_SECRET: key 1 of 1 has 31 bytes",
            id="short HS256 secret",
        ),
        pytest.param(
            {"SECKILL_JWT_SECRET": "j" * 32, "SECKILL_JWT_ALGORITHM": "RS256",
             "SECKILL_JWT_PUBLIC_KEY_FILE": "public.pem"},
            "SECKILL_JWT_SECRET is set beside SECKILL_JWT_ALGORITHM is RS256: unset one",
            id="HS256 secret beside RS256",
        ),
        pytest.param(
            {"SECKILL_JWT_SECRET": "j" * 32, "SECKILL_JWT_JWKS_FILE": "public.json"},
            "SECKILL_JWT_SECRET is set beside a key set",
            id="HS256 secret beside a key set",
        ),
        pytest.param(
            {"SECKILL_JWT_SECRET": "j" * 32, "SECKILL_JWT_PUBLIC_KEY_FILE": "public.pem"},
            "SECKILL_JWT_PUBLIC_KEY_FILE is set beside SECKILL_JWT_ALGORITHM is HS256",
            id="public key beside HS256",
        ),
        pytest.param(
            {"SECKILL_JWT_JWKS_FILE": "leaked.json"},
            "SECKILL_JWT_JWKS_FILE: key 'rsa-1': holds private key members (d, p, q, dp, dq, "
            "qi): publish only the public key",
            id="key set with a private key",
        ),
    ],
)  # fmt: skip
@pytest.mark.parametrize("command", [("config", "check"), ("worker", "reaper")])
def test_a_weak_contradictory_or_leaked_key_is_refused(
    tmp_path: Path, variables: dict[str, str], says: str, command: tuple[str, ...]
) -> None:
    """A one-byte payment key was accepted; JWT_SECRET beside RS256 silently ignored; a key
    set carrying a private key ("d") accepted."""
    assert RSA.private_pem is not None
    public = serialization.load_pem_private_key(RSA.private_pem, None).public_key()
    (tmp_path / "public.pem").write_bytes(
        public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.PKCS1)
    )
    (tmp_path / "public.json").write_bytes(document(RSA))
    leaked = dict(RSA.key.as_dict(private=True)) | {"kid": "rsa-1", "alg": "RS256"}
    (tmp_path / "leaked.json").write_bytes(document(leaked))
    refused(run(tmp_path, *command, **variables), says=says)
    nothing_created(tmp_path, besides=("leaked.json", "public.json", "public.pem"))


class _Handler(BaseHTTPRequestHandler):
    """GET: what ``server.mode`` says, counting the bytes it managed to send."""

    server: _JwksServer

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if self.server.mode == "huge-announced":
            self.send_header("Content-Length", str(200_000_000))
        self.end_headers()
        chunk = b" " * 65_536 if self.server.mode.startswith("huge") else b" "
        pause = 0 if self.server.mode.startswith("huge") else 1.0
        try:
            while self.server.sent < 200_000_000 and not self.server.stopping:
                self.wfile.write(chunk)
                self.wfile.flush()
                self.server.sent += len(chunk)
                time.sleep(pause)
        except OSError:
            return  # the client hung up: what it must do

    def log_message(self, *args: object) -> None:
        pass


class _JwksServer(ThreadingHTTPServer):
    daemon_threads = True
    mode = ""
    sent = 0
    stopping = False


@contextlib.contextmanager
def jwks_server(mode: str) -> Iterator[_JwksServer]:
    server = _JwksServer(("127.0.0.1", 0), _Handler)
    server.mode = mode
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stopping = True
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("trickle", "no whole answer within 5 s"),  # a byte a second: no read ever times out
        (
            "huge",
            "larger than 1000000 bytes, not a key set (stopped reading it there)",
        ),  # no length given
        ("huge-announced", "(200000000 announced; not read)"),
    ],
)
def test_the_key_set_fetch_is_bounded_in_time_and_size(
    tmp_path: Path, mode: str, says: str
) -> None:
    """A server sending a byte every few seconds hung `seckill api` at start; a 200 MB answer
    was downloaded whole (540 MB resident) before the 1 MB check."""
    with jwks_server(mode) as server:
        url = f"http://idp:hunter2-jwks@127.0.0.1:{server.server_address[1]}/jwks.json"
        started = time.monotonic()
        done = run(tmp_path, "config", "check", SECKILL_JWT_JWKS_URL=url)
        elapsed = time.monotonic() - started
        sent = server.sent
    line = refused(done, says=says)
    assert line.startswith("problem: SECKILL_JWT_JWKS_URL: cannot fetch http://idp:***@")
    assert "hunter2" not in done.stdout + done.stderr
    assert elapsed < 20
    assert sent < 20_000_000  # read no further than a socket's buffers past the bound
    nothing_created(tmp_path)


async def test_a_key_set_refresh_is_bounded_too() -> None:
    """The running API's refresh (rotation) waited as long as the server trickled; its warning
    printed the URL's password."""
    with jwks_server("trickle") as server:
        source = JwksSource(
            setting="SECKILL_JWT_JWKS_URL",
            url=f"http://idp:hunter2@127.0.0.1:{server.server_address[1]}/jwks.json",
        )
        started = time.monotonic()
        async with httpx.AsyncClient() as client:
            with pytest.raises(ValueError, match="no whole answer within 5 s") as refused:
                await source.aload(client)
        assert time.monotonic() - started < FETCH_TIMEOUT_SECONDS + 1
    assert "http://idp:***@127.0.0.1:" in str(refused.value)
    assert "hunter2" not in str(refused.value)


def test_a_command_that_checks_no_token_does_not_fetch_the_key_set(tmp_path: Path) -> None:
    """The same list of checks, but an identity provider that is down stops only what checks
    tokens (config check, the API, the workers at start), never a migration."""
    variables = {
        "SECKILL_JWT_JWKS_URL": f"http://127.0.0.1:{free_port()}/jwks.json",
        "SECKILL_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path}/shop.db",
    }
    refused(run(tmp_path, "config", "check", **variables), says="cannot fetch http://127.0.0.1")
    migrated = run(tmp_path, "db", "upgrade", **variables)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    # Its form is checked all the same.
    variables["SECKILL_JWT_JWKS_URL"] = "ftp://idp/jwks.json"
    refused(run(tmp_path, "db", "upgrade", **variables), says="SECKILL_JWT_JWKS_URL (ftp://")
