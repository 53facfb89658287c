"""The fault soak's smaller run (``python -m benchmarks.soak --small``): the same deployment and
every kind of fault, fewer times, and every verdict must pass. ``make soak`` runs the full one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

POSTGRES_URL = os.environ.get("SECKILL_TEST_POSTGRES_URL")
FAULTS = ("api", "bridge", "broker", "master", "persister", "reaper", "replica", "rewind", "sql")


@pytest.mark.slow
@pytest.mark.skipif(not POSTGRES_URL, reason="the soak runs on PostgreSQL: set "
                    "SECKILL_TEST_POSTGRES_URL")  # fmt: skip
def test_a_sale_through_every_fault_passes_every_verdict() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.soak", "--small"],
        capture_output=True,
        text=True,
        timeout=900,
        env=os.environ | {"COLUMNS": "200"},
    )

    shown = done.stdout[-6000:] + done.stderr[-4000:]
    assert done.returncode == 0, shown
    assert "Verdicts" in done.stdout and "FAIL" not in done.stdout, shown
    faults = done.stdout.split("Faults", 1)[1].split("Verdicts", 1)[0]
    for kind in FAULTS:
        assert f" {kind} " in faults, f"{kind} never happened: {shown}"
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert (figures["paid_lost"], figures["phantom_messages"]) == (0, 0), figures
