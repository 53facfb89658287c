"""Dead letters over HTTP, for the operator's console: the list, a page at a time; replay and
drop, as ``seckill dead-letters replay`` and ``drop`` do (the same service)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query

from seckill.api.auth import AdminIdentity
from seckill.api.bodies import body_schema, strict_body
from seckill.api.context import context
from seckill.api.errors import documented
from seckill.api.paging import DEFAULT_LIMIT, Cursor, Limit, decode_cursor, encode_cursor
from seckill.api.schemas import (
    DeadLetterOut,
    DeadLetterPageOut,
    DeadLettersIn,
    LetterSettledOut,
    SettledOut,
)
from seckill.bootstrap.services import Context
from seckill.domain.dead_letters import DeadLetter
from seckill.services.dead_letters import (
    LetterPosition,
    Settled,
    dead_letter_page,
    drop_dead_letters,
    replay_dead_letters,
)

router = APIRouter(prefix="/api/v1/admin", tags=["admin"])
Ctx = Annotated[Context, Depends(context)]


@router.get(
    "/dead-letters", response_model=DeadLetterPageOut, responses=documented(401, 403, 422, 503)
)
async def dead_letters(
    _: AdminIdentity,
    ctx: Ctx,
    group: Annotated[
        str | None,
        Query(max_length=200, description="One consumer group's only (default: every group)."),
    ] = None,
    settled: Annotated[
        bool, Query(description="Replayed and dropped ones too (the persister's).")
    ] = False,
    cursor: Cursor = None,
    limit: Limit = DEFAULT_LIMIT,
) -> DeadLetterPageOut:
    """The stream entries a consumer group gave up on, newest first, with why: pending ones
    (``seckill dead-letters replay`` or ``drop`` them), and with ``settled`` the rest too."""
    page = await dead_letter_page(
        ctx.ledger, ctx.runtime.engine, group=group, include_settled=settled,
        before=decode_cursor(cursor, _position), limit=limit,
    )  # fmt: skip
    after = page.next_cursor
    return DeadLetterPageOut(
        dead_letters=[_letter_out(letter) for letter in page.letters],
        next_cursor=None if after is None else encode_cursor(f"{after[0].isoformat()} {after[1]}"),
    )


@router.post(
    "/dead-letters/replay",
    response_model=SettledOut,
    responses=documented(401, 403, 413, 415, 422, 503),
    openapi_extra=body_schema(DeadLettersIn),
)
async def replay(
    _: AdminIdentity, body: Annotated[DeadLettersIn, Depends(strict_body(DeadLettersIn))], ctx: Ctx
) -> SettledOut:
    """Replay these pending dead letters once what made them fail is fixed: the persister's
    land in SQL, a bridge's go to the server's broker (SECKILL_BRIDGE_URL) again. One that
    still cannot is left pending, with why in ``refused``."""
    sink = ctx.bridge_sink()
    try:
        done = await replay_dead_letters(
            ctx.ledger, ctx.runtime.engine, body.ids, group=body.group, sink=sink
        )
    finally:
        if sink is not None:
            await sink.close()
    return _settled_out(done)


@router.post(
    "/dead-letters/drop",
    response_model=SettledOut,
    responses=documented(401, 403, 413, 415, 422, 503),
    openapi_extra=body_schema(DeadLettersIn),
)
async def drop(
    _: AdminIdentity, body: Annotated[DeadLettersIn, Depends(strict_body(DeadLettersIn))], ctx: Ctx
) -> SettledOut:
    """Give up on these pending dead letters for good: the persister's stay in SQL, marked
    dropped; a bridge's leave the dead-letter stream."""
    done = await drop_dead_letters(ctx.ledger, ctx.runtime.engine, body.ids, group=body.group)
    return _settled_out(done)


def _settled_out(done: Settled) -> SettledOut:
    return SettledOut(
        ok=done.ok,
        missing=done.missing,
        letters=[LetterSettledOut(id=r.id, refused=r.refused) for r in done.letters],
    )


def _position(text: str) -> LetterPosition:
    """When the letter died (to the microsecond, as recorded) and its id."""
    died_at, _, letter_id = text.partition(" ")
    moment = datetime.fromisoformat(died_at)  # ValueError for anything else
    if moment.tzinfo is None or not letter_id:
        raise ValueError(text)
    return moment, letter_id


def _letter_out(letter: DeadLetter) -> DeadLetterOut:
    return DeadLetterOut(
        id=letter.id, group=letter.group, stream=letter.stream, entry_id=letter.entry_id,
        payload=letter.payload, error=letter.error, deliveries=letter.deliveries,
        died_at=letter.died_at, replayed_at=letter.replayed_at, dropped_at=letter.dropped_at,
    )  # fmt: skip
