"""Draining an API process: the flag ``/readyz`` reads, raised when SIGTERM arrives.

A draining process answers ``/readyz`` 503 and everything else as usual, so a load balancer
takes it out of rotation before it stops (``seckill.serve`` times the drain and then stops the
server). Where the flag is raised depends on who receives the signal:

* ``seckill serve`` and ``seckill api --server uvicorn --workers 1``: the process that serves,
  which raises its own ``Drain`` (``begin()``);
* ``seckill api`` under granian, or uvicorn with several processes: the supervisor, which serves
  nothing. Its worker processes are forked or spawned by the server, so no object can be handed
  to them; each reads the one ``Drain`` of the run from a file instead. ``Drain.for_processes``
  makes a directory for the run and names the flag file in ``SECKILL_DRAIN_FLAG`` before the
  workers start; each worker's ``Drain.from_environment`` looks for that file at every
  ``/readyz`` (one ``stat``, a few times a minute), so a worker respawned mid-drain drains too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

DRAIN_FLAG_VARIABLE = "SECKILL_DRAIN_FLAG"
"""Names the flag file of a run to its worker processes (set by the supervisor, not a setting)."""


class Drain:
    """Whether this process is draining: ``begin()`` was called here, or the run's flag file
    (``flag``, when the process is one of several) exists."""

    def __init__(self, flag: Path | None = None) -> None:
        self.flag = flag
        self._begun = False

    @property
    def draining(self) -> bool:
        return self._begun or (self.flag is not None and self.flag.exists())

    def begin(self) -> None:
        """Drain from now on, and so does every process that shares the flag file."""
        self._begun = True
        if self.flag is not None:
            self.flag.touch()

    @classmethod
    def from_environment(cls) -> Drain:
        """A worker process's drain: the run's flag file, if its supervisor named one."""
        path = os.environ.get(DRAIN_FLAG_VARIABLE)
        return cls(Path(path) if path else None)

    @classmethod
    @contextlib.contextmanager
    def for_processes(cls) -> Iterator[Drain]:
        """A supervisor's drain, shared with the worker processes it starts inside the block
        (they inherit the environment); the flag's directory is removed at the end."""
        directory = Path(tempfile.mkdtemp(prefix="seckill-drain-"))
        flag = directory / "draining"
        os.environ[DRAIN_FLAG_VARIABLE] = str(flag)
        try:
            yield cls(flag)
        finally:
            os.environ.pop(DRAIN_FLAG_VARIABLE, None)
            shutil.rmtree(directory, ignore_errors=True)
