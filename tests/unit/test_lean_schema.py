"""Each lean route is declared once, and the schema is rendered from that declaration: every lean
route has its entry, every entry is served (by a lean route or a framework route, never both),
and the framework's router still knows a lean route's path for what it answers there."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.routing import Match

from seckill.api import buyers
from seckill.api.app import SeckillApi, create_app
from seckill.api.lean_schema import with_lean_routes
from tests.support.isolated_settings import isolated_settings

PARAMETER = re.compile(r"{\w+}")


@pytest.fixture
def app(tmp_path: Path) -> SeckillApi:
    return create_app(isolated_settings(tmp_path))  # no runtime: nothing here asks for one


def served_by_the_framework(app: SeckillApi, method: str, path: str) -> bool:
    scope: dict[str, Any] = {
        "type": "http", "method": method, "path": path, "root_path": "", "headers": [],
        "query_string": b"",
    }  # fmt: skip
    return any(route.matches(scope)[0] is Match.FULL for route in app.routes)


def test_every_lean_route_has_its_entry_and_every_entry_is_served_once(app: SeckillApi) -> None:
    schema = app.openapi()
    entries = {
        (path, method.upper()) for path, methods in schema["paths"].items() for method in methods
    }
    lean = {(route.template, route.method) for route in app.lean_routes.routes}
    assert lean - entries == set(), "a lean route the schema does not declare"
    for template, method in entries:
        path = PARAMETER.sub("1", template)
        route = app.lean_routes.route_for(method, path)
        by_framework = served_by_the_framework(app, method, path)
        # A framework route on a lean route's path and method would never be reached: a stub.
        assert (route is not None) != by_framework, f"{method} {template}"
        if route is not None:
            assert (route.template, route.method) == (template, method)
    # A lean route's path holds no other entry than the lean routes'.
    lean_paths = {template for template, _ in lean}
    assert {entry for entry in entries if entry[0] in lean_paths} == lean


def test_an_entry_declared_by_a_lean_route_and_by_the_framework_is_refused() -> None:
    framework = {
        "openapi": "3.1.0",
        "info": {"title": "t", "version": "0"},
        "paths": {buyers.BUY.template: {"post": {"responses": {}}}},
    }
    with pytest.raises(ValueError, match="declared twice"):
        with_lean_routes(framework, [buyers.BUY])


def test_the_entries_are_the_declarations(app: SeckillApi) -> None:
    buy = app.openapi()["paths"][buyers.BUY.template]["post"]
    assert buy["summary"] == "Buy"
    assert buy["description"].startswith("Hold units for the buyer: 202")
    assert buy["security"] == [{"HTTPBearer": []}]
    headers = {p["name"]: p["required"] for p in buy["parameters"] if p["in"] == "header"}
    assert headers == {"Idempotency-Key": True, "Seckill-Ticket": False}
    assert set(buy["responses"]) == {"202", *map(str, buyers.BUY.errors)}
    assert "Retry-After" in buy["responses"]["409"]["headers"]


@pytest.mark.parametrize("method", ["HEAD", "PUT", "DELETE", "OPTIONS"])
@pytest.mark.parametrize("path", ["/api/v1/items/1", "/api/v1/items/1/orders", "/livez"])
async def test_another_method_on_a_lean_path_is_the_frameworks_405(
    app: SeckillApi, method: str, path: str
) -> None:
    # HEAD too: the framework never served HEAD on these routes (a GET route of its own is not
    # a HEAD one), so the framework's 405 it has always been.
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as http:
        answer = await http.request(method, path)
    assert answer.status_code == 405
    if method != "HEAD":
        assert answer.json()["error"] == "method_not_allowed"


async def test_a_lean_path_with_a_trailing_slash_is_redirected(app: SeckillApi) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as http:
        answer = await http.get("/api/v1/items/1/")
    assert (answer.status_code, answer.headers["location"]) == (307, "http://t/api/v1/items/1")
