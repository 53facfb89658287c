"""Dead letters: stream entries the persister gave up on, listed, and landed again once the
cause is fixed (each lands once at most: a replayed letter is no longer pending)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from seckill.domain.events import BadEvent, decode_event
from seckill.engine.keys import shard_of
from seckill.store.ledger import Ledger
from seckill.store.records import DeadLetterRecord


async def list_dead_letters(
    ledger: Ledger, *, include_replayed: bool = False
) -> list[DeadLetterRecord]:
    """The dead letters in the order they died, with their errors; pending ones only unless
    ``include_replayed``."""
    return await ledger.dead_letters(include_replayed=include_replayed)


@dataclass(frozen=True, slots=True)
class LetterReplay:
    """What replaying one dead letter did."""

    dead_letter_id: int
    refused: str | None  # why it still cannot land; None: it landed


@dataclass(frozen=True, slots=True)
class Replay:
    """A replay: the ids asked for that are not pending, then each letter tried, in order."""

    missing: list[int]
    letters: list[LetterReplay]

    @property
    def ok(self) -> bool:
        """Every letter asked for was pending and landed."""
        return not self.missing and all(r.refused is None for r in self.letters)


async def replay_dead_letters(ledger: Ledger, ids: Collection[int] = ()) -> Replay:
    """Land the pending dead letters with these ids (none given: every pending one).

    A letter that lands is marked replayed; one that still contradicts the record stays
    pending, with the reason in the answer.
    """
    pending = await ledger.dead_letters()
    missing = sorted(set(ids) - {d.id for d in pending})
    letters = []
    for letter in pending:
        if ids and letter.id not in ids:
            continue
        try:
            event = decode_event(letter.entry_id, letter.payload, shard=shard_of(letter.stream))
            await ledger.apply([event])
        except BadEvent as exc:
            letters.append(LetterReplay(letter.id, refused=str(exc)))
            continue
        await ledger.mark_replayed(letter.id)
        letters.append(LetterReplay(letter.id, refused=None))
    return Replay(missing, letters)
