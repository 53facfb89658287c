from __future__ import annotations

import time

import pytest

from seckill.domain.ids import EPOCH_MS, OrderIds, WorkerIdLost, issued_at_ms


def test_ids_are_unique_and_increasing_even_beyond_4096_per_ms() -> None:
    ids = OrderIds(7, clock=lambda: EPOCH_MS + 1_000)  # a frozen clock: every id in one ms
    issued = [ids.next() for _ in range(20_000)]
    assert issued == sorted(issued)
    assert len(set(issued)) == len(issued)


def test_a_clock_stepping_back_never_repeats_an_id() -> None:
    now = [EPOCH_MS + 10_000]
    ids = OrderIds(3, clock=lambda: now[0])
    before = [ids.next() for _ in range(10)]
    now[0] -= 5_000
    after = [ids.next() for _ in range(10)]
    assert min(after) > max(before)


def test_two_workers_never_collide_in_the_same_ms() -> None:
    clock = lambda: EPOCH_MS + 42  # noqa: E731
    a, b = OrderIds(1, clock=clock), OrderIds(2, clock=clock)
    assert not {a.next() for _ in range(5_000)} & {b.next() for _ in range(5_000)}


def test_ids_fit_a_signed_64_bit_column_and_tell_their_time() -> None:
    ids = OrderIds(1023)
    order_id = ids.next()
    assert 0 < order_id < 2**63
    assert abs(issued_at_ms(order_id) - time.time() * 1000) < 5_000


def test_a_lapsed_lease_stops_the_generator() -> None:
    ids = OrderIds(5, valid_until=time.monotonic() - 1)
    with pytest.raises(WorkerIdLost):
        ids.next()
    ids.extend(time.monotonic() + 60)
    assert ids.next() > 0


@pytest.mark.parametrize("worker_id", [-1, 1024])
def test_worker_id_out_of_range(worker_id: int) -> None:
    with pytest.raises(ValueError, match="worker id"):
        OrderIds(worker_id)
