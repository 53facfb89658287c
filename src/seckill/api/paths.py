"""What a URL may say, stated once: the lean routes' paths and the bound of an item id in a path.

The lean routes' paths (``seckill.api.lean_routes``) are matched there, in the metrics (naming
the route of a request answered before routing) and in the benchmarks' admission middleware, and
each route's declaration (in ``seckill.api.buyers``, ``seckill.api.tickets``,
``seckill.api.queue``, and ``seckill.api.lean_routes`` for the liveness probe) names its path in
the OpenAPI schema; all of them read them from here. Item ids are bounded by the domain's
rule (``seckill.domain.rules.MAX_ID``: they fit a signed 64-bit SQL column), never restated.
"""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import Path
from starlette.types import Scope

from seckill.domain.rules import MAX_ID

ITEM_ROUTE = "/api/v1/items/{item_id}"
TICKET_ROUTE = "/api/v1/items/{item_id}/tickets"
PURCHASE_ROUTE = "/api/v1/items/{item_id}/orders"
QUEUE_ROUTE = "/api/v1/items/{item_id}/queue"
"""The routes' templates: their names in the schema and in the metrics' ``route`` label."""
LIVEZ_ROUTE = "/livez"  # the liveness probe, served with them (no item id)


def route_pattern(template: str) -> re.Pattern[str]:
    """The paths on a route; group 1 is the item id as sent (not yet checked)."""
    return re.compile(template.replace("{item_id}", "([^/]+)"))


PURCHASE_PATH = route_pattern(PURCHASE_ROUTE)

ItemId = Annotated[int, Path(ge=1, le=MAX_ID)]
"""An ``{item_id}`` path parameter: the framework's routes read it, and the lean routes' schema
entries declare theirs with it."""


def is_purchase(scope: Scope) -> bool:
    """Whether an ASGI request is a purchase: ``POST`` on the purchase path."""
    return (
        scope["type"] == "http"
        and scope["method"] == "POST"
        and PURCHASE_PATH.fullmatch(scope["path"]) is not None
    )
