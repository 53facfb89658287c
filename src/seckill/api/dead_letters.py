"""Dead letters over HTTP, for the operator's console: the list, a page at a time (replaying and
dropping them stay with ``seckill dead-letters``)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query

from seckill.api.auth import AdminIdentity
from seckill.api.context import context
from seckill.api.errors import documented
from seckill.api.paging import DEFAULT_LIMIT, Cursor, Limit, decode_cursor, encode_cursor
from seckill.api.schemas import DeadLetterOut, DeadLetterPageOut
from seckill.bootstrap.services import Context
from seckill.domain.dead_letters import DeadLetter
from seckill.services.dead_letters import LetterPosition, dead_letter_page

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
