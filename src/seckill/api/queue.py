"""The waiting room over HTTP: join an item's queue, then watch where you stand.

``POST /api/v1/items/{id}/queue`` (buyer token) puts the caller in the queue, or finds them
there, and answers their standing with a signed pass. ``GET`` on the same path, with the pass in
``Seckill-Queue-Pass``, answers the standing again: cheap (nothing written, no read of the
buyer's place), and cacheable for a second. Once the state reads ``admitted``, the buyer takes a
ticket (``POST .../tickets``) and buys as usual. Both are served by ``seckill.api.lean_routes``;
the routes here declare them for the schema. See ``seckill.services.waiting_room``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header
from pydantic import BaseModel, ConfigDict, Field

from seckill.api.auth import BuyerIdentity
from seckill.api.errors import documented
from seckill.api.paths import QUEUE_ROUTE, ItemId
from seckill.domain.queue import QueueState
from seckill.security.passes import PASS_HEADER
from seckill.services.waiting_room import Standing

router = APIRouter(prefix="/api/v1", tags=["buyers"])


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


PassHeader = Annotated[
    str | None,
    Header(alias=PASS_HEADER, description="The pass from joining (403 invalid_pass without)."),
]


@router.post(
    QUEUE_ROUTE.removeprefix(router.prefix),
    response_model=StandingOut,
    responses=documented(401, 403, 404, 422, 503),
)
async def join_queue(item_id: ItemId, buyer: BuyerIdentity) -> StandingOut:
    """Join the item's waiting room (from ``queue_open_seconds`` before the sale), or be told
    your place again. Joiners before the start are placed in a random order at the start,
    later ones in the order they came. 404 ``no_waiting_room`` when the server runs none."""
    raise NotImplementedError("the queue is served by seckill.api.lean_routes")


@router.get(
    QUEUE_ROUTE.removeprefix(router.prefix),
    response_model=StandingOut,
    responses=documented(401, 403, 404, 422, 503),
)
async def queue_standing(
    item_id: ItemId, buyer: BuyerIdentity, queue_pass: PassHeader = None
) -> StandingOut:
    """Where you stand in the item's waiting room. Answers may be a second old."""
    raise NotImplementedError("the queue is served by seckill.api.lean_routes")


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
