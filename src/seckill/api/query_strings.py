"""Query strings, read one way on every route: each parameter once.

Starlette keeps every value of a repeated parameter and FastAPI hands a route the last, so
``?limit=1&limit=2`` would be read as 2 here and as 1 by a proxy, a cache or a log that reads the
first. A parameter given twice is a 422 naming it, on the framework's routes (the app's one
dependency, ``query_once``) and the lean ones (``LeanRoutes`` asks ``check_query_once``).
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from starlette.requests import Request

from seckill.api.errors import ApiError
from seckill.domain.outcomes import ApiRefusal


def check_query_once(query_string: bytes) -> None:
    """``ApiError`` 422 ``invalid_request`` naming the first parameter given twice, if any."""
    if not query_string:
        return
    # Parsed as Starlette parses it, so the names are the ones a route reads.
    names = [name for name, _ in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)]
    if len(set(names)) == len(names):
        return
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ApiError(422, ApiRefusal.INVALID_REQUEST, f"query.{name}: given twice")
        seen.add(name)


async def query_once(request: Request) -> None:
    """The framework's routes' dependency (the app's, so every route has it)."""
    check_query_once(request.scope["query_string"])
