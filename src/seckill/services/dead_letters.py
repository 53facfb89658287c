"""Dead letters (``seckill.domain.dead_letters``) as an operator handles them, whichever group
gave up on them: listed; replayed once the cause is fixed (the persister's land in SQL; a
bridge's are published to its broker again, under the message id the bridge gave them, so a
copy is dropped as any other); or dropped once a person decided they never will (the
persister's stay in SQL, marked dropped; a bridge's leave the dead-letter stream). A letter is
settled once at most: a settled one is no longer pending."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from seckill.domain.dead_letters import PERSISTER_GROUP, DeadLetter
from seckill.domain.events import BadEvent, decode_event
from seckill.engine.dead_letters import delete_dead_letter, read_dead_letters
from seckill.engine.engine import RedisEngine
from seckill.engine.keys import shard_of
from seckill.services.paging import DEFAULT_PAGE, page_size
from seckill.sinks import Sink, SinkError, bridge_group, order_message
from seckill.store.ledger import Ledger


async def list_dead_letters(
    ledger: Ledger,
    engine: RedisEngine,
    *,
    group: str | None = None,
    include_settled: bool = False,
) -> list[DeadLetter]:
    """The dead letters of ``group`` (default: every group), the persister's first; pending
    ones only unless ``include_settled`` (a bridge's leave no trace once settled)."""
    letters = []
    if group in (None, PERSISTER_GROUP):
        letters += await ledger.dead_letters(include_settled=include_settled)
    if group != PERSISTER_GROUP:  # the persister's copies on the streams: SQL has them above
        letters += [
            letter
            for letter in await read_dead_letters(engine)
            if letter.group != PERSISTER_GROUP and group in (None, letter.group)
        ]
    return letters


LetterPosition = tuple[datetime, str]
"""Where a dead letter stands in a list, newest first: when it died, then its id."""


@dataclass(frozen=True, slots=True)
class LetterPage:
    """A page of dead letters, newest first; ``next_cursor``: the position of the last one,
    where the next page starts below (None: this page is the last)."""

    letters: list[DeadLetter]
    next_cursor: LetterPosition | None


def position(letter: DeadLetter) -> LetterPosition:
    return (letter.died_at, letter.id)


async def dead_letter_page(
    ledger: Ledger,
    engine: RedisEngine,
    *,
    group: str | None = None,
    include_settled: bool = False,
    before: LetterPosition | None = None,
    limit: int = DEFAULT_PAGE,
) -> LetterPage:
    """One page of ``list_dead_letters``, newest first (by when they died, then id), those
    below ``before`` if given. Dead letters are the exception, never a sale's worth: they are
    read whole and paged here."""
    limit = page_size(limit)
    letters = sorted(
        await list_dead_letters(ledger, engine, group=group, include_settled=include_settled),
        key=position,
        reverse=True,
    )
    if before is not None:
        letters = [letter for letter in letters if position(letter) < before]
    more = len(letters) > limit
    return LetterPage(letters[:limit], position(letters[limit - 1]) if more else None)


@dataclass(frozen=True, slots=True)
class LetterSettled:
    """What replaying or dropping one dead letter did."""

    id: str
    refused: str | None  # why it is still pending; None: it was settled


@dataclass(frozen=True, slots=True)
class Settled:
    """The ids asked for that name no pending dead letter, then each letter tried, in order."""

    missing: list[str]
    letters: list[LetterSettled]

    @property
    def ok(self) -> bool:
        """Every letter asked for was pending and is settled now."""
        return not self.missing and all(r.refused is None for r in self.letters)


async def replay_dead_letters(
    ledger: Ledger,
    engine: RedisEngine,
    ids: Collection[str] = (),
    *,
    group: str | None = None,
    sink: Sink | None = None,
) -> Settled:
    """Replay the pending dead letters with these ids (none given: every pending one of
    ``group``, default every group). A bridge's are published through ``sink``, which must be
    that bridge's broker, once SQL has landed their event (the persister's letters go first, so
    one call replays both of an entry both set aside). A letter that still cannot land or be
    delivered stays pending, with the reason in the answer."""
    chosen, missing = await _choose(ledger, engine, ids, group)
    letters = []
    for letter in chosen:
        if letter.group == PERSISTER_GROUP:
            refused = await _land(ledger, letter)
        else:
            refused = await _deliver(ledger, engine, letter, sink)
        letters.append(LetterSettled(letter.id, refused))
    return Settled(missing, letters)


async def drop_dead_letters(
    ledger: Ledger, engine: RedisEngine, ids: Collection[str], *, group: str | None = None
) -> Settled:
    """Drop the pending dead letters with these ids (of ``group``, if given)."""
    chosen, missing = await _choose(ledger, engine, ids, group)
    for letter in chosen:
        if letter.group == PERSISTER_GROUP:
            await ledger.mark_dropped(int(letter.id))
        else:
            await delete_dead_letter(engine, letter.id)
    return Settled(missing, [LetterSettled(letter.id, None) for letter in chosen])


async def _choose(
    ledger: Ledger, engine: RedisEngine, ids: Collection[str], group: str | None
) -> tuple[list[DeadLetter], list[str]]:
    """The pending letters asked for (all of ``group`` when no id is given), and the ids that
    name none."""
    pending = await list_dead_letters(ledger, engine, group=group)
    if not ids:
        return pending, []
    wanted = set(ids)
    known = {letter.id for letter in pending}
    return [letter for letter in pending if letter.id in wanted], sorted(wanted - known)


async def _land(ledger: Ledger, letter: DeadLetter) -> str | None:
    try:
        event = decode_event(letter.entry_id, letter.payload, shard=shard_of(letter.stream))
        await ledger.apply([event])
    except BadEvent as exc:
        return f"still cannot land: {exc}"
    await ledger.mark_replayed(int(letter.id))
    return None


async def _deliver(
    ledger: Ledger, engine: RedisEngine, letter: DeadLetter, sink: Sink | None
) -> str | None:
    if sink is None:
        return "no broker to deliver to: set SECKILL_BRIDGE_URL (or pass --to)"
    if bridge_group(sink.name) != letter.group:
        return f"a letter of {letter.group}, and the broker given is {sink.name}"
    try:
        event = decode_event(letter.entry_id, letter.payload, shard=shard_of(letter.stream))
        message = order_message(event, stream=letter.stream)
    except BadEvent as exc:
        return f"not an event a broker can take: {exc} (drop it)"
    if message is not None:
        # A bridge publishes only what SQL has: the persister's letter of the same entry, if it
        # set it aside too, must land first.
        if not await ledger.landed_events([event]):
            return "not in SQL: replay the persister's dead letter of this entry first"
        try:
            await sink.publish([message])
        except SinkError as exc:
            return f"{sink.name} did not take it: {exc}"
    await delete_dead_letter(engine, letter.id)
    return None
