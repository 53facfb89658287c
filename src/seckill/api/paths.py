"""What a URL may say, stated once: the purchase path and the bound of an item id in a path.

The purchase path is matched in four places (the app's dispatch to the lean purchase route, that
route reading the item id, the metrics naming the route of a request answered before routing,
and the benchmarks' admission middleware) and declared in one (the OpenAPI schema's entry in
``seckill.api.buyers``); all of them read it from here. Item ids are bounded by the domain's rule
(``seckill.domain.rules.MAX_ID``: they fit a signed 64-bit SQL column), never restated.
"""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import Path
from starlette.types import Scope

from seckill.domain.rules import MAX_ID

PURCHASE_ROUTE = "/api/v1/items/{item_id}/orders"
"""The purchase route's template: its name in the schema and in the metrics' ``route`` label."""

PURCHASE_PATH = re.compile(PURCHASE_ROUTE.replace("{item_id}", "([^/]+)"))
"""A path on the purchase route; group 1 is the item id as sent (not yet checked)."""

ItemId = Annotated[int, Path(ge=1, le=MAX_ID)]
"""An ``{item_id}`` path parameter, for the routes served through the framework."""


def is_purchase(scope: Scope) -> bool:
    """Whether an ASGI request is a purchase: ``POST`` on the purchase path."""
    return (
        scope["type"] == "http"
        and scope["method"] == "POST"
        and PURCHASE_PATH.fullmatch(scope["path"]) is not None
    )
