"""What a failed demo shows of its server's log: the lines above INFO, tracebacks included."""

from __future__ import annotations

from pathlib import Path

from seckill.demo import COMPLAINTS_SHOWN, server_complaints


def test_a_failed_demo_shows_the_servers_warnings_and_tracebacks(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    log.write_text(
        "2026-11-27 00:40:12,345 INFO seckill.serve persister started\n"
        "2026-11-27 00:40:12,345 INFO alembic upgrade 0005 -> 0006, a message on\n"
        "two lines\n"
        "2026-11-27 00:40:12,346 WARNING seckill.workers.bridge nats unreachable\n"
        "2026-11-27 00:40:12,347 DEBUG seckill.engine read\n"
        "2026-11-27 00:40:13,001 ERROR seckill.workers.loop bridge: pass failed\n"
        "Traceback (most recent call last):\n"
        "ValueError: boom\n"
    )
    assert server_complaints(log).splitlines() == [
        "2026-11-27 00:40:12,346 WARNING seckill.workers.bridge nats unreachable",
        "2026-11-27 00:40:13,001 ERROR seckill.workers.loop bridge: pass failed",
        "Traceback (most recent call last):",
        "ValueError: boom",
    ]


def test_only_the_last_complaints_are_shown(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    log.write_text("".join(f"2026-11-27 00:40:12,345 WARNING x {n}\n" for n in range(100)))
    shown = server_complaints(log).splitlines()
    assert len(shown) == COMPLAINTS_SHOWN and shown[-1].endswith("x 99")
    log.write_text("2026-11-27 00:40:12,345 INFO x quiet\n")
    assert server_complaints(log) == "(none)"
