"""Order ids: unique, time-ordered 64-bit integers (snowflake layout).

    | 41 bits: ms since 2024-01-01 UTC | 10 bits: worker id | 12 bits: sequence |

Two generators never collide as long as they hold different worker ids; see
``seckill.engine.worker_ids`` for how a process leases one. Within one generator ids strictly
increase, even if the wall clock steps back (the generator keeps its own high-water mark).
"""

from __future__ import annotations

import time
from collections.abc import Callable

EPOCH_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z
WORKER_BITS = 10
SEQUENCE_BITS = 12
MAX_WORKER_ID = (1 << WORKER_BITS) - 1
_SEQUENCE_MASK = (1 << SEQUENCE_BITS) - 1


class WorkerIdLost(RuntimeError):
    """The worker id lease lapsed: issuing more ids could collide with another process."""


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class OrderIds:
    """Issues order ids for one worker id.

    ``valid_until`` (a ``time.monotonic()`` instant) bounds how long the worker id may be used;
    a lease renews it through :meth:`extend`. A statically assigned worker id never lapses.
    """

    def __init__(
        self,
        worker_id: int,
        *,
        clock: Callable[[], int] = wall_clock_ms,
        valid_until: float = float("inf"),
    ) -> None:
        if not 0 <= worker_id <= MAX_WORKER_ID:
            raise ValueError(f"worker id must be from 0 to {MAX_WORKER_ID}, got {worker_id}")
        self.worker_id = worker_id
        self._clock = clock
        self._valid_until = valid_until
        self._last_ms = 0
        self._sequence = 0

    def extend(self, valid_until: float) -> None:
        self._valid_until = valid_until

    @property
    def leased(self) -> bool:
        """Whether the worker id is leased (and may lapse), not assigned for good."""
        return self._valid_until != float("inf")

    @property
    def lapsed(self) -> bool:
        """Whether the worker id's lease lapsed: ``next()`` refuses until it is renewed."""
        return time.monotonic() > self._valid_until

    def next(self) -> int:
        if time.monotonic() > self._valid_until:
            raise WorkerIdLost(f"worker id {self.worker_id} is no longer leased")
        now = max(self._clock() - EPOCH_MS, self._last_ms)
        if now == self._last_ms:
            self._sequence = (self._sequence + 1) & _SEQUENCE_MASK
            if self._sequence == 0:  # 4096 ids in one ms: borrow the next ms
                now += 1
        else:
            self._sequence = 0
        self._last_ms = now
        return (
            (now << (WORKER_BITS + SEQUENCE_BITS))
            | (self.worker_id << SEQUENCE_BITS)
            | (self._sequence)
        )


def issued_at_ms(order_id: int) -> int:
    """When an order id was issued (epoch ms), read back from its top bits."""
    return (order_id >> (WORKER_BITS + SEQUENCE_BITS)) + EPOCH_MS
