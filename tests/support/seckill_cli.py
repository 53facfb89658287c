"""Running the ``seckill`` command as an operator would: a subprocess on given Redis, SQL and
data directory, with no SECKILL_* setting leaking in from the test's own environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def seckill(
    *args: str, redis_url: str, sql_url: str, data_dir: Path, redis_cluster: bool = False
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SECKILL_")}
    env |= {
        "SECKILL_REDIS_URL": redis_url,
        "SECKILL_REDIS_CLUSTER": str(redis_cluster).lower(),
        "SECKILL_DATABASE_URL": sql_url,
        "SECKILL_DATA_DIR": str(data_dir),
        "COLUMNS": "200",
    }
    return subprocess.run(
        [sys.executable, "-m", "seckill.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
