"""The README's main job, at a small size, through the real command line."""

from __future__ import annotations

import os
import subprocess
import sys


def test_the_demo_passes_its_verdicts_on_embedded_defaults() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SECKILL_")}
    result = subprocess.run(
        [sys.executable, "-m", "seckill.cli", "demo", "--buyers", "500", "--units", "20"],
        capture_output=True,
        text=True,
        env={**env, "COLUMNS": "200"},
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "All checks pass." in result.stdout
    for verdict in (
        "not oversold",
        "buyers within limit",
        "journal complete",
        "replays identical",
        "every order in SQL",
        "SQL stock == Redis stock",
    ):
        assert verdict in result.stdout
    assert "FAIL" not in result.stdout
