"""PgBouncer as the deployment runs it, started here: the settings of
``deploy/k8s/base/pgbouncer.ini`` (transaction pooling, the pool's bounds, the startup
parameters it drops) with the address, the server, the authentication and the files of the
caller's own. The API tests (``tests/api/test_pgbouncer.py``) and the hosts rehearsal
(``benchmarks.hosts``) run seckill through it.

PgBouncer refuses to run as root: as root it switches to the ``postgres`` user (``-u``), so its
directory must be one that user can enter.
"""

from __future__ import annotations

import configparser
import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy.engine import make_url

DEPLOYED_INI = Path(__file__).resolve().parent.parent / "deploy" / "k8s" / "base" / "pgbouncer.ini"
# A transaction pooler's URL says so (seckill.store.database.through_transaction_pooler).
POOLED = {"prepared_statement_cache_size": "0"}


class NoPgBouncer(RuntimeError):
    """No pgbouncer on PATH (scripts/system-deps installs Debian's)."""


def binary() -> str:
    found = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/sbin")
    if found is None:
        raise NoPgBouncer("no pgbouncer on PATH: run scripts/system-deps (as root) to install it")
    return found


def deployed_settings() -> dict[str, str]:
    """The ``[pgbouncer]`` section of the deployment's file."""
    parser = configparser.ConfigParser(comment_prefixes=(";", "#"), interpolation=None)
    parser.read_string(DEPLOYED_INI.read_text())
    return dict(parser["pgbouncer"])


def pooled_url(server_url: str, *, host: str, port: int) -> str:
    """``server_url`` (seckill's URL of a PostgreSQL database) through PgBouncer at host:port."""
    url = make_url(server_url).set(host=host, port=port)
    return url.update_query_dict(POOLED).render_as_string(hide_password=False)


class PgBouncer:
    """One PgBouncer in ``directory`` (its configuration, log and pid file), listening on
    ``host:port``, pooling every database of the server at ``server_host:server_port`` as
    ``server_user`` (a server that trusts it); clients are trusted too (``auth_type = trust``
    against a list of the users they may name). ``launcher``: a command prefix that runs it
    elsewhere (``ip netns exec NS`` on a rehearsal's host)."""

    def __init__(
        self,
        directory: Path,
        *,
        host: str,
        port: int,
        server_host: str,
        server_port: int,
        server_user: str,
        launcher: Sequence[str] = (),
        overrides: dict[str, str] | None = None,
    ) -> None:
        self.directory = directory
        self.host, self.port = host, port
        self.server = (server_host, server_port, server_user)
        self.launcher = tuple(launcher)
        self.overrides = overrides or {}
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def ini(self) -> Path:
        return self.directory / "pgbouncer.ini"

    @property
    def log(self) -> Path:
        return self.directory / "pgbouncer.log"

    def settings(self) -> dict[str, str]:
        """The deployment's settings under this instance's own."""
        return deployed_settings() | self.overrides | {
            "listen_addr": self.host,
            "listen_port": str(self.port),
            "unix_socket_dir": "",
            "auth_type": "trust",
            "auth_file": str(self.directory / "userlist.txt"),
            "logfile": str(self.log),
            "pidfile": str(self.directory / "pgbouncer.pid"),
            "admin_users": self.server[2],
            "stats_users": self.server[2],
        }  # fmt: skip

    def write(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        server_host, server_port, user = self.server
        lines = ["[databases]", f"* = host={server_host} port={server_port} user={user}", "",
                 "[pgbouncer]", *(f"{k} = {v}" for k, v in self.settings().items())]  # fmt: skip
        self.ini.write_text("\n".join(lines) + "\n")
        (self.directory / "userlist.txt").write_text(f'"{user}" ""\n')
        if os.geteuid() == 0:
            self.directory.chmod(0o755)
            for path in (self.directory, *self.directory.iterdir()):
                shutil.chown(path, "postgres", "postgres")

    def argv(self) -> list[str]:
        as_user = ["-u", "postgres"] if os.geteuid() == 0 else []
        return [*self.launcher, binary(), *as_user, str(self.ini)]

    def start(self) -> None:
        self.write()
        with (self.directory / "pgbouncer.out").open("ab") as out:
            self.popen = subprocess.Popen(self.argv(), stdout=out, stderr=subprocess.STDOUT)
        give_up = time.monotonic() + 10
        while "listening on" not in self.log_text():
            if self.popen.poll() is not None or time.monotonic() > give_up:
                said = (self.directory / "pgbouncer.out").read_text(errors="replace")
                raise RuntimeError(f"pgbouncer did not start: {said[-2000:]}")
            time.sleep(0.05)

    def log_text(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")
        return ""

    def admin(self, command: str) -> list[dict[str, str]]:
        """A command of PgBouncer's admin console (``SHOW STATS``), its rows, through psql."""
        done = subprocess.run(
            [*self.launcher, "psql", "-h", self.host, "-p", str(self.port), "-U", self.server[2],
             "-d", "pgbouncer", "-A", "-F", "\t", "-P", "footer=off", "-c", command],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        header, *rows = done.stdout.splitlines()
        names = header.split("\t")
        return [dict(zip(names, row.split("\t"), strict=True)) for row in rows]

    def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGINT)  # closes its server connections at once
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
