"""Secrets generated into the data directory (``seckill.security.generated``): stable, private,
and the same for processes racing to create them."""

from __future__ import annotations

import multiprocessing
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from seckill.security.generated import generated_secret

# --- generated secrets -----------------------------------------------------------------------


def test_generated_secret_is_stable_and_private(tmp_path: Path) -> None:
    data_dir = tmp_path / "fresh" / "data"
    first = generated_secret(data_dir, "jwt")
    assert generated_secret(data_dir, "jwt") == first
    assert generated_secret(data_dir, "payment") != first
    path = data_dir / "secrets" / "jwt"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert sorted(p.name for p in path.parent.iterdir()) == ["jwt", "payment"]


def test_generated_secret_reads_an_existing_file_stripped(tmp_path: Path) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "jwt").write_text("  hand-written secret\n")
    assert generated_secret(tmp_path, "jwt") == "hand-written secret"


def test_empty_secret_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "jwt").write_text(" \n")
    with pytest.raises(ValueError, match="is empty"):
        generated_secret(tmp_path, "jwt")


@pytest.mark.parametrize("name", ["", "../jwt", "a/b", ".hidden", "JWT"])
def test_secret_names_cannot_leave_the_directory(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="secret name"):
        generated_secret(tmp_path, name)


def test_loser_of_the_creation_race_reads_the_winner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another process writes the file after our existence check and before our link.
    real_link: Callable[..., None] = os.link

    def link_after_a_rival(source: str, destination: Path) -> None:
        Path(destination).write_text("the winner's secret\n")
        real_link(source, destination)

    monkeypatch.setattr(os, "link", link_after_a_rival)
    assert generated_secret(tmp_path, "jwt") == "the winner's secret"
    assert [p.name for p in (tmp_path / "secrets").iterdir()] == ["jwt"]  # no temp file left


def _race(data_dir: Path, barrier: Any, results: Any) -> None:
    barrier.wait()
    results.put(generated_secret(data_dir, "jwt"))


def test_processes_racing_on_a_fresh_directory_agree(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    racers = 6
    barrier, results = context.Barrier(racers), context.Queue()
    processes = [
        context.Process(target=_race, args=(tmp_path / "data", barrier, results))
        for _ in range(racers)
    ]
    for process in processes:
        process.start()
    values = [results.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    assert len(set(values)) == 1
    assert values[0] == generated_secret(tmp_path / "data", "jwt")
    assert [p.name for p in (tmp_path / "data" / "secrets").iterdir()] == ["jwt"]
