"""Purchase tickets over HTTP: issue one, and the header the purchase route reads it from.

``POST /api/v1/items/{id}/tickets`` (buyer token) answers ``{"ticket", "expires_at"}``; the
buyer sends the ticket in ``Seckill-Ticket`` with each purchase until it expires. Refusals:
409 ``sold_out`` (the purchase's own answer) while this process's sold-out flag stands for the
item, 403 ``not_started`` / ``ended`` outside the issuing window, 404 ``unknown_item`` for an
item not on sale, 429 ``gate_refused`` with ``Retry-After`` when the gate (captcha, waiting
room) says not yet; on the purchase route, 403 ``invalid_ticket`` for a ticket that is missing,
forged, expired, or for another buyer or item. See ``seckill.services.tickets`` and
``seckill.security.tickets``; the refusals' answers are in ``seckill.api.errors``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Header
from pydantic import BaseModel, Field

from seckill.api.auth import BuyerIdentity
from seckill.api.errors import documented
from seckill.api.paths import TICKET_ROUTE, ItemId
from seckill.domain.times import ms_to_datetime
from seckill.security.tickets import TICKET_HEADER, Ticket

router = APIRouter(prefix="/api/v1", tags=["buyers"])

TicketHeader = Annotated[
    str | None,
    Header(
        alias=TICKET_HEADER,
        description=(
            "Required. A ticket from POST /api/v1/items/{item_id}/tickets for this buyer and "
            "item, unexpired; it may be sent with several attempts. Without a valid one: 403 "
            "invalid_ticket, and no stock is touched."
        ),
    ),
]
"""The purchase route's ticket parameter (optional to the schema so that its absence gets our
403, not the framework's 422)."""


class TicketOut(BaseModel):
    ticket: str = Field(description=f"Send it in the {TICKET_HEADER} header when buying.")
    expires_at: datetime = Field(description="The ticket is refused from this moment on.")


@router.post(
    TICKET_ROUTE.removeprefix(router.prefix),
    response_model=TicketOut,
    responses=documented(401, 403, 404, 409, 422, 429, 503),
)
async def issue_ticket(item_id: ItemId, buyer: BuyerIdentity) -> TicketOut:
    """A short-lived ticket to buy this item, issued from shortly before the sale until its
    end. 429 ``gate_refused`` (with ``Retry-After``) when the waiting room says not yet.

    409 ``sold_out`` (the purchase's own answer) while this process knows the item is sold
    out: a purchase here heard it from Redis less than SECKILL_SOLD_OUT_RECHECK_MS ago. That
    refusal costs no Redis call and changes nothing; a unit that comes back is offered again
    once the interval has passed. Otherwise a ticket is issued whatever is left, and the
    purchase tells whether a unit is."""
    # The schema's entry only: tickets are issued by seckill.api.lean_routes, ahead of the
    # framework, and the schema tests hold its answers to what is declared here.
    raise NotImplementedError("tickets are issued by seckill.api.lean_routes")


def ticket_out(text: str, ticket: Ticket) -> TicketOut:
    return TicketOut(ticket=text, expires_at=ms_to_datetime(ticket.expires_at_ms))
