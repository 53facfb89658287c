"""The drain's length under each profile, and its flag shared by a supervisor's processes."""

from __future__ import annotations

import os

from seckill.api.drain import DRAIN_FLAG_VARIABLE, Drain
from seckill.config import PRODUCTION_DRAIN_SECONDS, Settings


def test_a_drain_in_production_none_embedded_unless_set() -> None:
    assert Settings(profile="embedded", drain_seconds=None).effective_drain_seconds == 0
    production = Settings(profile="production", drain_seconds=None)
    assert production.effective_drain_seconds == PRODUCTION_DRAIN_SECONDS > 0
    assert Settings(profile="production", drain_seconds=0).effective_drain_seconds == 0
    assert Settings(profile="embedded", drain_seconds=1.5).effective_drain_seconds == 1.5


def test_the_supervisors_drain_reaches_every_process_of_the_run() -> None:
    assert not Drain().draining
    with Drain.for_processes() as supervisor:
        worker = Drain.from_environment()  # as each worker process builds its own
        assert worker.flag == supervisor.flag and not worker.draining
        supervisor.begin()
        assert supervisor.draining and worker.draining
        assert Drain.from_environment().draining  # one respawned mid-drain drains too
        flag = supervisor.flag
    assert DRAIN_FLAG_VARIABLE not in os.environ
    assert flag is not None and not flag.parent.exists()
