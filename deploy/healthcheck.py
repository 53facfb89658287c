"""The image's HEALTHCHECK: exit 0 when this container's seckill process answers ``/livez``.

One image runs every role, and the roles listen on different ports: ``seckill api`` (and
``seckill serve``) on ``SECKILL_API_PORT``, a worker on ``SECKILL_METRICS_PORT`` (its metrics
listener, which serves ``/livez`` too). So both are asked, on loopback; whichever answers 200
makes the container healthy. Neither answering is exit 1. ``seckill db upgrade`` runs to its end
before the first check and needs none.

Standard library only: it runs with the image's Python, every few seconds, and imports nothing of
seckill (which would take longer than the check).
"""

from __future__ import annotations

import os
import sys
import urllib.request

PATH = "/livez"
TIMEOUT_S = 2.0


def ports() -> list[str]:
    """The API's port, then the worker's metrics port when one is set."""
    found = [os.environ.get("SECKILL_API_PORT") or "8000"]
    metrics = os.environ.get("SECKILL_METRICS_PORT")
    if metrics and metrics != "0":
        found.append(metrics)
    return found


def alive(port: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{PATH}", timeout=TIMEOUT_S) as answer:
            return bool(answer.status == 200)
    except OSError:  # refused, timed out, or an HTTP error status
        return False


def main() -> int:
    return 0 if any(alive(port) for port in ports()) else 1


if __name__ == "__main__":
    sys.exit(main())
