"""The waiting room's fairness, measured: how far an order is from another.

Pure functions over plain sequences, used by the crowd's verdicts and the tests.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence


def rank_correlation(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman's rho of two equally long sequences without ties: 1 for the same order, -1 for
    the reverse, about 0 (with a standard deviation of 1/sqrt(n-1)) for unrelated orders."""
    n = len(xs)
    if n != len(ys) or n < 2:
        raise ValueError("two sequences of the same length, at least 2, are needed")
    rank_x, rank_y = _ranks(xs), _ranks(ys)
    squared = sum((a - b) ** 2 for a, b in zip(rank_x, rank_y, strict=True))
    return 1 - 6 * squared / (n * (n * n - 1))


def unrelated_bound(n: int, sigmas: float = 4.0) -> float:
    """The |rho| two unrelated orders of ``n`` stay under but once in about 15,000 (4 sigma)."""
    return sigmas / math.sqrt(max(1, n - 1))


def inversions(values: Sequence[float]) -> int:
    """Pairs i < j with values[i] > values[j] (0: sorted), counted in O(n log n)."""
    items = list(values)
    return _sort_counting(items)[1]


def admission_times(
    steps: Sequence[tuple[float, int]], positions: Sequence[int]
) -> list[float | None]:
    """When each of ``positions`` was let in, from the inlet's steps ``(time, up to)`` in the
    order it took them: the time of the first step whose frontier reached the position (None
    for a position no step reached)."""
    times: list[float] = []
    reached: list[int] = []  # the frontier after each step: never lower than before
    for t, upto in steps:
        times.append(t)
        reached.append(max(upto, reached[-1]) if reached else upto)
    found: list[float | None] = []
    for position in positions:
        index = bisect.bisect_left(reached, position)
        found.append(times[index] if index < len(reached) else None)
    return found


def _ranks(values: Sequence[float]) -> list[int]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0] * len(values)
    for rank, index in enumerate(order):
        ranks[index] = rank
    return ranks


def _sort_counting(items: list[float]) -> tuple[list[float], int]:
    if len(items) < 2:
        return items, 0
    middle = len(items) // 2
    left, a = _sort_counting(items[:middle])
    right, b = _sort_counting(items[middle:])
    merged: list[float] = []
    count = a + b
    i = j = 0
    while i < len(left) and j < len(right):
        if right[j] < left[i]:
            merged.append(right[j])
            count += len(left) - i
            j += 1
        else:
            merged.append(left[i])
            i += 1
    merged.extend(left[i:])
    merged.extend(right[j:])
    return merged, count
