"""What a crowd does: how many buyers, how fast, and what each does with a hold."""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum


class Fate(StrEnum):
    """What a buyer does once a purchase is held."""

    PAY = "pay"  # the provider's notice says the payment succeeded
    FAIL = "fail"  # the provider's notice says it failed: the hold is released
    CANCEL = "cancel"  # the buyer cancels
    EXPIRE = "expire"  # nothing: the hold runs out and the reaper releases it


@dataclass(frozen=True, slots=True, kw_only=True)
class CrowdPlan:
    buyers: int = 10_000
    late_buyers: int | None = None  # None: a quarter of the first crowd
    concurrency: int = 64
    duration_s: float | None = None
    units: int = 100
    per_buyer_limit: int = 2
    hold_seconds: int = 2
    pay: float = 0.5
    fail: float = 0.05
    cancel: float = 0.2
    replay: float = 0.1
    # Of the buyers who pay, the share charged twice (a double click on "pay"): the second
    # charge must come back as a refund owed, never as a second sale.
    double_charge: float = 0.1
    # Once per sale, the provider also charges one held order a cent short (before its right
    # payment) and charges for an order never issued: each must come back as a refund owed of
    # the sum charged, the short-charged order still payable.
    stray_charges: bool = True
    seed: int = 7

    def __post_init__(self) -> None:
        problems = []
        if self.buyers < 1 or self.units < 1 or self.per_buyer_limit < 1:
            problems.append("buyers, units and the per-buyer limit must be at least 1")
        if self.concurrency < 1 or self.hold_seconds < 1:
            problems.append("concurrency and hold seconds must be at least 1")
        if self.duration_s is not None and self.duration_s <= 0:
            problems.append("the duration must be positive")
        if self.late_buyers is not None and self.late_buyers < 0:
            problems.append("late buyers must be 0 or more")
        shares = {
            "pay": self.pay, "fail": self.fail, "cancel": self.cancel, "replay": self.replay,
            "double_charge": self.double_charge,
        }  # fmt: skip
        problems += [
            f"{k} must be a share between 0 and 1" for k, v in shares.items() if not 0 <= v <= 1
        ]
        if self.pay + self.fail + self.cancel > 1:
            problems.append("pay + fail + cancel must be at most 1 (the rest let holds expire)")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def late_crowd(self) -> int:
        return self.buyers // 4 if self.late_buyers is None else self.late_buyers

    def fate(self, rng: random.Random) -> Fate:
        draw = rng.random()
        for fate, share in (
            (Fate.PAY, self.pay),
            (Fate.FAIL, self.fail),
            (Fate.CANCEL, self.cancel),
        ):
            if draw < share:
                return fate
            draw -= share
        return Fate.EXPIRE

    def quantity(self, rng: random.Random) -> int:
        """Mostly one unit; one buyer in four asks for up to the limit (so limits are tried)."""
        return rng.randint(1, self.per_buyer_limit) if rng.random() < 0.25 else 1


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuePlan:
    """The crowd through a waiting room: the item is created with one, and its sale starts
    ``lead_s`` after, so the first crowd joins before it (their places are drawn at the start)
    and the late crowd after (first come, first served)."""

    lead_s: float = 3.0
    admit_per_second: int | None = None  # the item's pace (None: the deployment's)
    front_s: float = 0.5  # how old a poll's answer may be: SECKILL_QUEUE_FRONT_SECONDS
    clock_tolerance_s: float = 0.0  # how far the crowd's clock may be from Redis's

    def __post_init__(self) -> None:
        if self.lead_s <= 0 or self.front_s <= 0 or self.clock_tolerance_s < 0:
            raise ValueError("the lead and front seconds must be positive, the tolerance >= 0")
        if self.admit_per_second is not None and self.admit_per_second < 0:
            raise ValueError("the pace must be at least 0")
