"""Purchase tickets over HTTP: issue one, and the header the purchase route reads it from.

``POST /api/v1/items/{id}/tickets`` (buyer token) answers ``{"ticket", "expires_at"}``; the
buyer sends the ticket in ``Seckill-Ticket`` with each purchase until it expires. Refusals:
409 ``sold_out`` (the purchase's own answer) while this process's sold-out flag stands for the
item, 403 ``not_started`` / ``ended`` outside the issuing window, 404 ``unknown_item`` for an
item not on sale, 429 ``gate_refused`` with ``Retry-After`` when the gate (captcha, waiting
room) says not yet; on the purchase route, 403 ``invalid_ticket`` for a ticket that is missing,
forged, expired, or for another buyer or item. A lean route (``ISSUE_TICKET``, see
``seckill.api.lean_routes``); see ``seckill.services.tickets`` and ``seckill.security.tickets``;
the refusals' answers are in ``seckill.api.errors``.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from seckill.api.errors import documented
from seckill.api.lean_routes import REFUSED, Answer, HeaderParam, LeanRoute, Request
from seckill.api.paths import TICKET_ROUTE
from seckill.bootstrap.services import Context
from seckill.domain.outcomes import Outcome
from seckill.domain.times import ms_to_datetime
from seckill.security.tickets import TICKET_HEADER, Ticket
from seckill.security.tokens import Role
from seckill.services.sold_out import SoldOut

# Optional to the schema, as it has always been: a purchase without one gets our 403.
TICKET_PARAM = HeaderParam(
    name=TICKET_HEADER,
    description=(
        "Required. A ticket from POST /api/v1/items/{item_id}/tickets for this buyer and "
        "item, unexpired; it may be sent with several attempts. Without a valid one: 403 "
        "invalid_ticket, and no stock is touched."
    ),
)
"""The purchase route's ticket header."""


class TicketOut(BaseModel):
    ticket: str = Field(description=f"Send it in the {TICKET_HEADER} header when buying.")
    expires_at: datetime = Field(description="The ticket is refused from this moment on.")


async def issue_ticket(ctx: Context, request: Request) -> Answer:
    """A short-lived ticket to buy this item, issued from shortly before the sale until its
    end. 429 ``gate_refused`` (with ``Retry-After``) when the waiting room says not yet.

    409 ``sold_out`` (the purchase's own answer) while this process knows the item is sold
    out: a purchase here heard it from Redis less than SECKILL_SOLD_OUT_RECHECK_MS ago. That
    refusal costs no Redis call and changes nothing; a unit that comes back is offered again
    once the interval has passed. Otherwise a ticket is issued whatever is left, and the
    purchase tells whether a unit is."""
    try:
        text, ticket = await ctx.tickets.issue(request.item_id, buyer=request.caller)
    except SoldOut:
        return REFUSED[Outcome.SOLD_OUT]  # the crowd after the last unit: an answer built once
    return Answer(200, ticket_out(text, ticket).model_dump_json().encode(), "200", [])


ISSUE_TICKET = LeanRoute(
    method="POST",
    template=TICKET_ROUTE,
    decide=issue_ticket,
    caller=Role.BUYER,
    answer=TicketOut,
    errors=documented(401, 403, 404, 409, 422, 429, 503),
)


def ticket_out(text: str, ticket: Ticket) -> TicketOut:
    return TicketOut(ticket=text, expires_at=ms_to_datetime(ticket.expires_at_ms))
