"""The waiting room's fairness measures: pure functions over plain sequences."""

from __future__ import annotations

import itertools
import random

import pytest

from seckill.crowd.fairness import (
    admission_times,
    inversions,
    rank_correlation,
    unrelated_bound,
)


def test_rank_correlation_reads_the_same_the_reverse_and_unrelated_orders() -> None:
    xs = [0.5, 1.25, 2.0, 3.5, 8.0]
    assert rank_correlation(xs, [10, 20, 30, 40, 50]) == pytest.approx(1.0)
    assert rank_correlation(xs, [50, 40, 30, 20, 10]) == pytest.approx(-1.0)
    rng = random.Random(3)
    n = 2_000
    shuffled = rng.sample(range(n), n)
    assert abs(rank_correlation(range(n), shuffled)) < unrelated_bound(n)
    # Only the order counts, not the values.
    assert rank_correlation([1, 2, 3], [1, 100, 1_000]) == pytest.approx(1.0)


def test_rank_correlation_needs_two_equally_long_sequences() -> None:
    with pytest.raises(ValueError, match="same length"):
        rank_correlation([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="at least 2"):
        rank_correlation([1], [1])


def test_a_nearly_sorted_order_is_not_unrelated() -> None:
    n = 200
    swapped = list(range(n))
    for i in range(0, n - 1, 10):  # one neighbour swap in ten
        swapped[i], swapped[i + 1] = swapped[i + 1], swapped[i]
    assert rank_correlation(range(n), swapped) > unrelated_bound(n)
    assert unrelated_bound(10_001) == pytest.approx(0.04)


def test_inversions_counts_the_pairs_out_of_order() -> None:
    rng = random.Random(5)
    for n in (0, 1, 2, 7, 50):
        values = [rng.random() for _ in range(n)]
        brute = sum(1 for a, b in itertools.combinations(values, 2) if a > b)
        assert inversions(values) == brute
    assert inversions([1, 2, 2, 3]) == 0  # ties are in order
    assert inversions([3, 2, 1]) == 3


def test_admission_times_take_the_first_step_that_reached_each_position() -> None:
    steps = [(10.0, 3), (10.5, 3), (11.0, 7), (12.0, 8)]
    assert admission_times(steps, [1, 3, 4, 7, 8, 9]) == [10.0, 10.0, 11.0, 11.0, 12.0, None]
    assert admission_times([], [1]) == [None]
    # A step that reads lower than one before it moves nothing back: position 5 stays let in
    # at the first step that reached it.
    assert admission_times([(1.0, 6), (2.0, 4), (3.0, 9)], [5, 7]) == [1.0, 3.0]
