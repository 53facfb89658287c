"""The lean routes' OpenAPI entries, rendered from their declarations into the app's schema.

Each ``LeanRoute`` (``seckill.api.lean_routes``) says what its entry holds, and this renders it
as FastAPI renders an endpoint's: the summary and operation id from the decide function's name,
the description from its docstring, the item id path parameter (``seckill.api.paths.ItemId``),
the headers it reads, the bearer security of its caller's role (the scheme FastAPI finds behind
``seckill.api.auth``'s identities, as for the framework's routes), its JSON body (optional), its
success and the error answers ``seckill.api.errors.documented`` gives. Models become components
named by their class, bodies read in validation mode and answers in serialization mode, as the
framework's are; the result goes through FastAPI's own OpenAPI model, as its schema does.

The framework's schema holds its own routes only; an operation both declare is refused, and so
is a component the two render differently.
"""

from __future__ import annotations

import http.client
import inspect
import re
from collections.abc import Iterator, Sequence
from typing import Any, get_args

from fastapi.dependencies.models import Dependant
from fastapi.dependencies.utils import get_dependant
from fastapi.encoders import jsonable_encoder
from fastapi.openapi.constants import REF_TEMPLATE
from fastapi.openapi.models import OpenAPI
from fastapi.security.base import SecurityBase
from pydantic import TypeAdapter
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, JsonSchemaValue

from seckill.api.auth import AdminIdentity, BuyerIdentity
from seckill.api.lean_routes import LeanRoute
from seckill.api.paths import ItemId
from seckill.security.tokens import Role

_JSON = "application/json"
_PATH_PARAMETER = re.compile(r"{(\w+)}")
_PATH_PARAMETERS: dict[str, Any] = {"item_id": ItemId}
_IDENTITIES = {Role.BUYER: BuyerIdentity, Role.ADMIN: AdminIdentity}

# One piece of a route's entry that pydantic renders: (the route's place, what, which one).
_Piece = tuple[int, str, str]


def with_lean_routes(framework: dict[str, Any], routes: Sequence[LeanRoute]) -> dict[str, Any]:
    """The app's schema: the framework's, with each lean route's entry (first, by path)."""
    paths, definitions, schemes = _render(routes)
    for path, operations in framework.get("paths", {}).items():
        for method, operation in operations.items():
            if method in paths.get(path, {}):
                raise ValueError(f"{method.upper()} {path} is declared twice")
            paths.setdefault(path, {})[method] = operation
    components = dict(framework.get("components", {}))
    schemas = dict(components.get("schemas", {}))
    for name, definition in definitions.items():
        if schemas.setdefault(name, definition) != definition:
            raise ValueError(f"the component {name} is rendered two ways")
    components["schemas"] = dict(sorted(schemas.items()))
    if schemes:
        components["securitySchemes"] = {**components.get("securitySchemes", {}), **schemes}
    schema = {**framework, "components": components, "paths": paths}
    rendered: dict[str, Any] = jsonable_encoder(OpenAPI(**schema), by_alias=True, exclude_none=True)
    return rendered


def _render(
    routes: Sequence[LeanRoute],
) -> tuple[dict[str, dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """The routes' paths, the components their models need, and their security schemes."""
    ordered = sorted(routes, key=lambda route: route.template)  # stable: a path's methods stay
    pieces: dict[_Piece, tuple[JsonSchemaMode, Any]] = {}
    for place, route in enumerate(ordered):
        for name in _PATH_PARAMETER.findall(route.template):
            pieces[place, "path", name] = ("validation", _PATH_PARAMETERS[name])
        for header in route.headers:
            pieces[place, "header", header.name] = (
                "validation",
                str if header.required else str | None,
            )
        if route.body is not None:
            pieces[place, "body", ""] = ("validation", route.body | None)
        pieces[place, "answer", ""] = ("serialization", route.answer)
        for status, declared in route.errors.items():
            if "model" in declared:
                pieces[place, "error", str(status)] = ("serialization", declared["model"])
    rendered, definitions = GenerateJsonSchema(ref_template=REF_TEMPLATE).generate_definitions(
        [(piece, mode, TypeAdapter(kind).core_schema) for piece, (mode, kind) in pieces.items()]
    )
    schemas = {piece: rendered[piece, mode] for piece, (mode, _) in pieces.items()}
    paths: dict[str, dict[str, Any]] = {}
    schemes: dict[str, Any] = {}
    for place, route in enumerate(ordered):
        scheme = None if route.caller is None else _bearer(route.caller)
        if scheme is not None:
            schemes[scheme.scheme_name] = jsonable_encoder(
                scheme.model, by_alias=True, exclude_none=True
            )
        operation = _operation(route, place, schemas, scheme)
        paths.setdefault(route.template, {})[route.method.lower()] = operation
    return paths, {str(name): definition for name, definition in definitions.items()}, schemes


def _operation(
    route: LeanRoute,
    place: int,
    schemas: dict[_Piece, JsonSchemaValue],
    scheme: SecurityBase | None,
) -> dict[str, Any]:
    endpoint = route.decide.__name__
    unique = re.sub(r"\W", "_", f"{endpoint}{route.template}")
    operation: dict[str, Any] = {
        "tags": list(route.tags),
        "summary": _title(endpoint),
        "description": inspect.cleandoc(route.decide.__doc__ or "").split("\f")[0].strip(),
        "operationId": f"{unique}_{route.method.lower()}",
    }
    if scheme is not None:
        operation["security"] = [{scheme.scheme_name: []}]
    parameters = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": {**schemas[place, "path", name], "title": _title(name)},
        }
        for name in _PATH_PARAMETER.findall(route.template)
    ]
    parameters += [
        {
            "name": header.name,
            "in": "header",
            "required": header.required,
            "schema": {
                **schemas[place, "header", header.name],
                "description": header.description,
                "title": header.name,
            },
            "description": header.description,
        }
        for header in route.headers
    ]
    if parameters:
        operation["parameters"] = parameters
    if route.body is not None:
        body = {**schemas[place, "body", ""], "title": "Body"}
        operation["requestBody"] = {"content": {_JSON: {"schema": body}}}
    responses: dict[str, Any] = {
        str(route.status): {
            "description": "Successful Response",
            "content": {_JSON: {"schema": schemas[place, "answer", ""]}},
        }
    }
    for status, declared in route.errors.items():
        answer = {key: value for key, value in declared.items() if key != "model"}
        if "model" in declared:
            answer["content"] = {_JSON: {"schema": schemas[place, "error", str(status)]}}
        answer["description"] = declared.get("description") or http.client.responses[int(status)]
        responses[str(status)] = answer
    operation["responses"] = responses
    return operation


def _title(name: str) -> str:
    return name.replace("_", " ").title()  # as the framework names an endpoint or a parameter


def _bearer(role: Role) -> SecurityBase:
    """The security scheme FastAPI finds behind the identity of ``role`` (a framework route
    taking that identity declares the same)."""
    check = get_args(_IDENTITIES[role])[1].dependency
    schemes: list[SecurityBase] = []
    for found in _dependants(get_dependant(path="", call=check)):
        if isinstance(found.call, SecurityBase):
            schemes.append(found.call)
    [scheme] = schemes
    return scheme


def _dependants(dependant: Dependant) -> Iterator[Dependant]:
    yield dependant
    for each in dependant.dependencies:
        yield from _dependants(each)
