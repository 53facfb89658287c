"""TLS to Redis and to PostgreSQL, on real servers this module starts on free loopback ports.

A CA signs the servers' certificate (naming 127.0.0.1 and localhost) and a client's; a second,
unrelated CA stands for a wrong one. Redis 7 listens on a TLS port only and requires client
certificates (tls-auth-clients yes); a private PostgreSQL accepts TLS connections only (its
pg_hba.conf has hostssl lines and no host line). A runtime opened over rediss:// sells a unit
through the engine (redis-py's client, the worker-id lease and the pipelined purchase path, on
one Redis and on a 3-master cluster) and reaches SQL through both of its pools over TLS.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from redis.exceptions import ConnectionError as RedisConnectionError
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from seckill.bootstrap.runtime import Runtime, open_runtime
from seckill.bootstrap.tls import database_ssl_context, redis_ssl_options
from seckill.config import Settings
from seckill.domain.configuration import ConfigurationError
from seckill.engine.cluster import ClusterPipeliner, send_on_node
from seckill.engine.pipelining import Pipeliner
from seckill.redis_cluster import LocalCluster
from seckill.redis_server import RedisServer
from seckill.store.database import open_database
from seckill.store.migrate import upgrade
from tests.conftest import open_item, redis7_binary
from tests.support.redis_servers import free_port

# -- certificates -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # signs nothing here: a CA the servers' certificate does not come from


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    *,
    issuer: tuple[str, ec.EllipticCurvePrivateKey] | None = None,
    usages: tuple[x509.ObjectIdentifier, ...] = (),
    hosts: tuple[str, ...] = (),
) -> x509.Certificate:
    """A CA's own certificate (no ``issuer``), or a leaf signed by ``issuer``."""
    now = datetime.datetime.now(datetime.UTC)
    issuer_name, signer = (issuer[0], issuer[1]) if issuer else (subject, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if issuer is None:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        builder = builder.add_extension(
            x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
        )
    else:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()),
            critical=False,
        )
        builder = builder.add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
    if hosts:
        names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(signer, hashes.SHA256())


def _write(directory: Path, name: str, cert: x509.Certificate, key: Any = None) -> Path:
    path = directory / f"{name}.crt"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        (directory / f"{name}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        (directory / f"{name}.key").chmod(0o600)
    return path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca_key, other_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    server_key, client_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    issuer = ("seckill test CA", ca_key)
    # The servers' certificate serves for client auth too: the helpers' own connections to a
    # Redis that requires client certificates (readiness, forming a cluster) show it.
    server = _certificate(
        "seckill test server", server_key, issuer=issuer,
        usages=(ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH),
        hosts=("127.0.0.1", "localhost"),
    )  # fmt: skip
    client = _certificate(
        "seckill", client_key, issuer=issuer, usages=(ExtendedKeyUsageOID.CLIENT_AUTH,)
    )
    return Pki(
        ca=_write(directory, "ca", _certificate("seckill test CA", ca_key)),
        server_cert=_write(directory, "server", server, server_key),
        server_key=directory / "server.key",
        client_cert=_write(directory, "client", client, client_key),
        client_key=directory / "client.key",
        other_ca=_write(directory, "other-ca", _certificate("another CA", other_key)),
    )


# -- Redis ------------------------------------------------------------------------------------


def tls_args(pki: Pki, port: int) -> tuple[str, ...]:
    """redis-server on a TLS port only, requiring client certificates from the CA."""
    return (
        "--port", "0", "--tls-port", str(port),
        "--tls-cert-file", str(pki.server_cert), "--tls-key-file", str(pki.server_key),
        "--tls-ca-cert-file", str(pki.ca), "--tls-auth-clients", "yes",
    )  # fmt: skip


class TlsRedisServer(RedisServer):
    """A ``RedisServer`` on a TLS port: ``url`` carries the CA and the servers' own pair for
    the helper's readiness ping; ``rediss_url`` is the plain URL the settings name."""

    def __init__(self, pki: Pki, port: int, extra_args: tuple[str, ...] = ()) -> None:
        super().__init__(
            binary=redis7_binary(), port=port, extra_args=(*tls_args(pki, port), *extra_args)
        )
        self.pki = pki

    @property
    def rediss_url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}/0"

    @property
    def url(self) -> str:
        options = {
            "ssl_ca_certs": self.pki.ca,
            "ssl_certfile": self.pki.server_cert,
            "ssl_keyfile": self.pki.server_key,
        }
        return f"{self.rediss_url}?{urlencode(options)}"


class TlsCluster(LocalCluster):
    """A ``LocalCluster`` whose nodes speak TLS only, to clients and to each other."""

    def __init__(self, pki: Pki, **options: Any) -> None:
        super().__init__(binary=redis7_binary(), **options)
        self.pki = pki

    @property
    def url(self) -> str:
        return super().url.replace("redis://", "rediss://", 1)

    def _node(self, port: int) -> RedisServer:
        plain = super()._node(port)
        cluster = ("--tls-cluster", "yes", "--tls-replication", "yes")
        return TlsRedisServer(self.pki, port, extra_args=(*plain.extra_args, *cluster))

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1", port=port, decode_responses=True, ssl=True,
            ssl_ca_certs=str(self.pki.ca), ssl_certfile=str(self.pki.server_cert),
            ssl_keyfile=str(self.pki.server_key),
        )  # fmt: skip


@pytest.fixture(scope="module")
def tls_redis(pki: Pki) -> Iterator[TlsRedisServer]:
    with TlsRedisServer(pki, free_port()) as server:
        yield server


def redis_tls(pki: Pki, url: str, *, ca: Path | None = None, client: bool = True) -> Settings:
    return Settings(
        redis_url=url,
        redis_tls_ca_file=ca or pki.ca,
        redis_tls_cert_file=pki.client_cert if client else None,
        redis_tls_key_file=pki.client_key if client else None,
    )


async def sell_one(runtime: Runtime, item_id: int) -> None:
    """A unit sold through the engine: the reservation goes through the pipelined path."""
    await runtime.engine.load_item(open_item(item_id=item_id, total=3))
    reservation = await runtime.engine.reserve(
        item_id, buyer="b", quantity=1, idempotency_key=f"k{item_id}",
        order_id=runtime.order_ids.next(),
    )  # fmt: skip
    assert reservation.accepted
    stock = await runtime.engine.stock(item_id)
    assert stock is not None and (stock.available, stock.held) == (2, 1)


async def test_a_purchase_over_tls_to_one_redis(
    pki: Pki, tls_redis: TlsRedisServer, tmp_path: Path
) -> None:
    settings = redis_tls(pki, tls_redis.rediss_url).model_copy(update={"data_dir": tmp_path})
    async with open_runtime(settings) as runtime:  # the worker id leased over TLS too
        await sell_one(runtime, 1)
        pipeliner = runtime.engine.scripts.pipeliner
        assert isinstance(pipeliner, Pipeliner)
        assert sum(pipeliner.batch_sizes.values()) >= 1  # the reservation went that way
        assert await runtime.redis.get("no-such-key") is None


async def test_a_redis_that_wants_a_client_certificate_refuses_none(
    pki: Pki, tls_redis: TlsRedisServer
) -> None:
    options = redis_ssl_options(redis_tls(pki, tls_redis.rediss_url, client=False))
    pipeliner = Pipeliner(tls_redis.rediss_url, ssl_options=options)
    try:
        # Under TLS 1.3 the server's refusal comes after the handshake: a reset, when reading.
        with pytest.raises(RedisConnectionError):
            await pipeliner.execute("PING")
    finally:
        await pipeliner.aclose()


async def test_a_wrong_ca_is_refused_by_redis_py_and_the_pipeliner(
    pki: Pki, tls_redis: TlsRedisServer, tmp_path: Path
) -> None:
    settings = redis_tls(pki, tls_redis.rediss_url, ca=pki.other_ca)
    with pytest.raises(RedisConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        async with open_runtime(settings.model_copy(update={"data_dir": tmp_path})):
            pass
    pipeliner = Pipeliner(tls_redis.rediss_url, ssl_options=redis_ssl_options(settings))
    try:
        with pytest.raises(RedisConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
            await pipeliner.execute("PING")
    finally:
        await pipeliner.aclose()


async def test_a_purchase_over_tls_to_a_cluster(pki: Pki, tmp_path: Path) -> None:
    with TlsCluster(pki, masters=3, replicas=0) as cluster:
        settings = redis_tls(pki, cluster.url).model_copy(
            update={"data_dir": tmp_path, "redis_cluster": True}
        )
        async with open_runtime(settings) as runtime:
            for item_id in (1, 2, 3, 4, 5, 6):  # over the masters' slots
                await sell_one(runtime, item_id)
            pipeliner = runtime.engine.scripts.pipeliner
            assert isinstance(pipeliner, ClusterPipeliner)
            assert len(pipeliner.nodes.batch_sizes()) > 1  # more than one node's pipeliner
            # The calls that share one connection (a write and its WAIT) have their own pools.
            assert await send_on_node(pipeliner.nodes, "{item:1}", [("ECHO", "tls")]) == ["tls"]


# -- the settings' checks ---------------------------------------------------------------------


def test_tls_files_that_cannot_serve_are_named(pki: Pki, tmp_path: Path) -> None:
    url = "rediss://127.0.0.1:1/0"
    absent = tmp_path / "absent.pem"
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("not a certificate\n")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"redis_tls_ca_file": absent}, "SECKILL_REDIS_TLS_CA_FILE names .* not a file"),
        ({"redis_tls_ca_file": not_pem}, "SECKILL_REDIS_TLS_CA_FILE .* holds no PEM certificate"),
        (
            {"redis_tls_cert_file": pki.client_cert},
            "SECKILL_REDIS_TLS_CERT_FILE is set without SECKILL_REDIS_TLS_KEY_FILE",
        ),
        (
            {"redis_tls_cert_file": pki.client_cert, "redis_tls_key_file": pki.server_key},
            "SECKILL_REDIS_TLS_CERT_FILE and SECKILL_REDIS_TLS_KEY_FILE .* not a PEM certificate "
            "and its private key",
        ),
    ]
    for fields, message in cases:
        with pytest.raises(ConfigurationError, match=message):
            redis_ssl_options(Settings(redis_url=url, **fields))
    with pytest.raises(ConfigurationError, match="SECKILL_REDIS_URL is not a rediss:// URL"):
        redis_ssl_options(Settings(redis_url="redis://127.0.0.1:1/0", redis_tls_ca_file=pki.ca))
    with pytest.raises(ConfigurationError, match="the database is a SQLite file"):
        database_ssl_context(Settings(database_tls="require"))
    server = "postgresql+asyncpg://u@127.0.0.1:1/db"
    with pytest.raises(ConfigurationError, match="SECKILL_DATABASE_TLS is not"):
        database_ssl_context(Settings(database_url=server, database_tls_ca_file=pki.ca))
    with pytest.raises(ConfigurationError, match="SECKILL_DATABASE_TLS is require"):
        database_ssl_context(
            Settings(database_url=server, database_tls="require", database_tls_ca_file=pki.ca)
        )
    # Plain Redis and SQL ask for nothing: TLS off costs nothing.
    assert redis_ssl_options(Settings(redis_url="redis://127.0.0.1:1/0")) == {}
    assert database_ssl_context(Settings(database_url=server)) is None


async def test_tls_files_are_checked_before_anything_connects(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path, redis_url="rediss://127.0.0.1:1/0", redis_tls_ca_file=tmp_path / "x"
    )
    with pytest.raises(ConfigurationError, match="SECKILL_REDIS_TLS_CA_FILE"):
        async with open_runtime(settings):
            pass


# -- PostgreSQL -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Postgres:
    port: int

    def url(self, host: str = "127.0.0.1") -> str:
        return f"postgresql+asyncpg://postgres@{host}:{self.port}/postgres"


def _postgres_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
    return found[-1].parent if found else None


@pytest.fixture(scope="module")
def postgres(pki: Pki) -> Iterator[Postgres]:
    """A private PostgreSQL on a free port of 127.0.0.1 and 127.0.0.2, TLS only, run as the
    postgres user in a directory of its own; stopped and removed at the end of the module."""
    binaries = _postgres_bin()
    if binaries is None or os.geteuid() != 0 or not shutil.which("runuser"):
        pytest.skip("needs PostgreSQL's initdb and postgres (/usr/lib/postgresql) and root")
    directory = Path(tempfile.mkdtemp(prefix="seckill-pg-"))
    process: subprocess.Popen[bytes] | None = None
    try:
        for name in ("server.crt", "server.key"):
            shutil.copy(pki.server_cert if name.endswith("crt") else pki.server_key, directory)
        (directory / "pg_hba.conf").write_text(
            "local all all trust\nhostssl all all 127.0.0.0/8 trust\n"  # no plain host line
        )
        shutil.chown(directory, "postgres", "postgres")
        for path in directory.iterdir():
            shutil.chown(path, "postgres", "postgres")
        data = directory / "data"
        subprocess.run(
            ["runuser", "-u", "postgres", "--", str(binaries / "initdb"), "-D", str(data),
             "--no-sync", "-A", "trust", "-U", "postgres"],
            check=True, capture_output=True,
        )  # fmt: skip
        port = free_port()
        process = subprocess.Popen(
            [str(binaries / "postgres"), "-D", str(data), "-c", f"port={port}",
             "-c", "listen_addresses=127.0.0.1,127.0.0.2", "-k", str(directory),
             "-c", "ssl=on", "-c", f"ssl_cert_file={directory / 'server.crt'}",
             "-c", f"ssl_key_file={directory / 'server.key'}",
             "-c", f"hba_file={directory / 'pg_hba.conf'}",
             "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
            user="postgres", group="postgres", stdout=subprocess.DEVNULL,
            stderr=open(directory / "postgres.log", "wb"),  # noqa: SIM115 - closed with the child
        )  # fmt: skip
        _wait_listening(process, port, directory / "postgres.log")
        yield Postgres(port)
    finally:
        if process is not None:
            process.send_signal(signal.SIGINT)  # a fast shutdown
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(directory, ignore_errors=True)


def _wait_listening(process: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + 15
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"postgres exited at start: {log.read_text(errors='replace')}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                if "ready to accept connections" in log.read_text(errors="replace"):
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"postgres not ready in time: {log.read_text(errors='replace')}")
        time.sleep(0.05)


def database_tls(url: str, mode: str, ca: Path | None = None) -> Settings:
    return Settings(database_url=url, database_tls=mode, database_tls_ca_file=ca)


@pytest.fixture
async def opened() -> AsyncIterator[list[AsyncEngine]]:
    engines: list[AsyncEngine] = []
    yield engines
    for engine in engines:
        await engine.dispose()


async def encrypted(engine: AsyncEngine) -> bool:
    async with engine.connect() as conn:
        query = text("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        return bool((await conn.execute(query)).scalar_one())


async def test_the_ledger_over_verify_full(
    pki: Pki, postgres: Postgres, opened: list[AsyncEngine]
) -> None:
    settings = database_tls(postgres.url(), "verify-full", ca=pki.ca)
    engine = open_database(postgres.url(), tls=database_ssl_context(settings))
    opened.append(engine)
    await upgrade(engine)
    async with engine.begin() as conn:
        await conn.execute(text("CREATE TABLE IF NOT EXISTS tls_probe (n int)"))
        await conn.execute(text("INSERT INTO tls_probe VALUES (7)"))
    async with engine.connect() as conn:
        assert (await conn.execute(text("SELECT sum(n) FROM tls_probe"))).scalar_one() == 7
    assert await encrypted(engine)


async def test_a_wrong_ca_or_a_wrong_host_is_refused_by_postgres(
    pki: Pki, postgres: Postgres, opened: list[AsyncEngine]
) -> None:
    wrong_ca = database_tls(postgres.url(), "verify-full", ca=pki.other_ca)
    engine = open_database(postgres.url(), tls=database_ssl_context(wrong_ca))
    opened.append(engine)
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
        await encrypted(engine)
    # 127.0.0.2 is the same server, but its certificate does not name it: verify-full refuses,
    # verify-ca (the certificate from the CA, any host) and require (no check) accept.
    other_host = postgres.url("127.0.0.2")
    for mode, ca in (("verify-full", pki.ca), ("verify-ca", pki.ca), ("require", None)):
        engine = open_database(other_host, tls=database_ssl_context(
            database_tls(other_host, mode, ca=ca)
        ))  # fmt: skip
        opened.append(engine)
        if mode == "verify-full":
            with pytest.raises(ssl.SSLCertVerificationError, match="IP address mismatch"):
                await encrypted(engine)
        else:
            assert await encrypted(engine)


async def test_postgres_refuses_a_plain_connection(
    postgres: Postgres, opened: list[AsyncEngine]
) -> None:
    engine = open_database(postgres.url() + "?ssl=disable")
    opened.append(engine)
    with pytest.raises(DBAPIError, match="no encryption"):
        await encrypted(engine)


async def test_a_runtime_over_tls_to_redis_and_postgres(
    pki: Pki, tls_redis: TlsRedisServer, postgres: Postgres, tmp_path: Path
) -> None:
    settings = redis_tls(pki, tls_redis.rediss_url).model_copy(
        update={
            "data_dir": tmp_path,
            "database_url": postgres.url(),
            "database_tls": "verify-full",
            "database_tls_ca_file": pki.ca,
        }
    )
    async with open_runtime(settings) as runtime:
        await sell_one(runtime, 11)
        assert await encrypted(runtime.ledger.engine)
        assert await encrypted(runtime.request_ledger.engine)
