"""The waiting room over HTTP: join an item's queue, then watch where you stand.

``POST /api/v1/items/{id}/queue`` (buyer token) puts the caller in the queue, or finds them
there, and answers their standing with a signed pass. ``GET`` on the same path, with the pass in
``Seckill-Queue-Pass``, answers the standing again: cheap (nothing written, no read of the
buyer's place), and cacheable for a second. Once the state reads ``admitted``, the buyer takes a
ticket (``POST .../tickets``) and buys as usual. Both are lean routes (``JOIN_QUEUE``,
``QUEUE_STANDING``: see ``seckill.api.lean_routes``). See ``seckill.services.waiting_room``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from seckill.api.errors import documented
from seckill.api.lean_routes import Answer, HeaderParam, LeanRoute, Request, header_text
from seckill.api.paths import QUEUE_ROUTE
from seckill.bootstrap.services import Context
from seckill.domain.queue import QueueState
from seckill.security.passes import PASS_HEADER
from seckill.security.tokens import Role
from seckill.services.waiting_room import Standing

# A standing may be a second old anyway (each process reads a queue's front once for all).
_CACHE_A_SECOND = [(b"cache-control", b"private, max-age=1")]


class StandingOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    queue_pass: str = Field(
        alias="pass",
        description=f"Send it in the {PASS_HEADER} header to ask again; keep the newest one "
        "(the first answer after the start carries a pre-start joiner's position).",
    )
    position: int | None = Field(
        description="Your place in line, from 1. null: you joined before the start, and the "
        "places of those who did are drawn at random when it starts."
    )
    ahead: int | None = Field(description="Places before yours not let in yet.")
    admitted_up_to: int = Field(description="Every place up to this one has been let in.")
    estimated_wait_s: int | None = Field(
        description="Seconds until your turn at the recent pace (before the start: until the "
        "draw). null: unknown, as when nothing is left to sell right now."
    )
    state: QueueState = Field(
        description="waiting; admitted (take a ticket and buy); sold_out (nothing left, and no "
        "hold that could come back); ended."
    )


PASS_PARAM = HeaderParam(
    name=PASS_HEADER, description="The pass from joining (403 invalid_pass without)."
)
_PASS = PASS_PARAM.key


async def join_queue(ctx: Context, request: Request) -> Answer:
    """Join the item's waiting room (from ``queue_open_seconds`` before the sale), or be told
    your place again. Joiners before the start are placed in a random order at the start,
    later ones in the order they came. 404 ``no_waiting_room`` when the server runs none."""
    found = await ctx.waiting_room.join(request.item_id, request.caller)
    return Answer(200, standing_out(found).model_dump_json().encode(), "200", [])


async def queue_standing(ctx: Context, request: Request) -> Answer:
    """Where you stand in the item's waiting room. Answers may be a second old."""
    queue_pass = header_text(request.headers.get(_PASS))
    found = await ctx.waiting_room.standing(request.item_id, request.caller, queue_pass)
    return Answer(200, standing_out(found).model_dump_json().encode(), "200", _CACHE_A_SECOND)


JOIN_QUEUE = LeanRoute(
    method="POST",
    template=QUEUE_ROUTE,
    decide=join_queue,
    caller=Role.BUYER,
    answer=StandingOut,
    errors=documented(401, 403, 404, 422, 503),
)
QUEUE_STANDING = LeanRoute(
    method="GET",
    template=QUEUE_ROUTE,
    decide=queue_standing,
    caller=Role.BUYER,
    headers=(PASS_PARAM,),
    answer=StandingOut,
    errors=documented(401, 403, 404, 422, 503),
)


def standing_out(found: Standing) -> StandingOut:
    seen = found.standing
    return StandingOut(
        queue_pass=found.pass_text,
        position=seen.position,
        ahead=seen.ahead,
        admitted_up_to=seen.admitted_up_to,
        estimated_wait_s=seen.estimated_wait_s,
        state=seen.state,
    )
