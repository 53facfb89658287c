"""Query strings, read one way on every route: each parameter once.

Starlette keeps every value of a repeated parameter and FastAPI hands a route the last, so
``?limit=1&limit=2`` would be read as 2 here and as 1 by a proxy, a cache or a log that reads the
first. A parameter given twice is a 422 naming it, on the framework's routes (the app's one
dependency, ``query_once``) and the lean ones (``LeanRoutes`` asks ``check_query_once``), but a
parameter the route declares as a list (the dashboard's ``item``): that one is read whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, get_args, get_origin
from urllib.parse import parse_qsl

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.requests import Request

from seckill.api.errors import ApiError
from seckill.domain.outcomes import ApiRefusal


def check_query_once(query_string: bytes, repeatable: frozenset[str] = frozenset()) -> None:
    """``ApiError`` 422 ``invalid_request`` naming the first parameter given twice, if any
    (but those in ``repeatable``)."""
    if not query_string:
        return
    # Parsed as Starlette parses it, so the names are the ones a route reads.
    names = [name for name, _ in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)]
    if len(set(names)) == len(names):
        return
    seen: set[str] = set()
    for name in names:
        if name in seen and name not in repeatable:
            raise ApiError(422, ApiRefusal.INVALID_REQUEST, f"query.{name}: given twice")
        seen.add(name)


async def query_once(request: Request) -> None:
    """The framework's routes' dependency (the app's, so every route has it). A parameter given
    twice is looked up among the route's lists only then: the rare path pays for it."""
    query_string = request.scope["query_string"]
    try:
        check_query_once(query_string)
    except ApiError:
        route = request.scope.get("route")
        if not isinstance(route, APIRoute):
            raise
        check_query_once(query_string, _lists(route))


def _lists(route: APIRoute) -> frozenset[str]:
    """The query parameters ``route`` declares as lists (``list[int] | None``, say)."""
    return frozenset(
        field.alias
        for field in _query_params(route.dependant)
        if _is_list(field.field_info.annotation)
    )


def _query_params(dependant: Dependant) -> Iterator[Any]:
    """The query parameters of ``dependant`` and of its dependencies."""
    yield from dependant.query_params
    for inner in dependant.dependencies:
        yield from _query_params(inner)


def _is_list(annotation: Any) -> bool:
    kinds = (annotation, *get_args(annotation))  # ``list[int] | None``: its members too
    return any(get_origin(kind) in (list, tuple, set, frozenset) for kind in kinds)
