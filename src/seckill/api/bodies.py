"""Request bodies, read strictly: one JSON object, each key once, each value of its own type.

A lenient reader takes ``{"quantity": 1, "quantity": 3}`` as its last key, and ``"1"``,
``true`` or ``1.0`` as the number 1. A client or a payment provider whose parser reads the first
key, or sends a string, would then disagree with us about what it sent. So a key given twice is
a 422 naming it, and the models' integer fields take JSON integers only (``StrictInt``).
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from seckill.api.errors import ApiError, validation_message
from seckill.domain.outcomes import ApiRefusal

Model = TypeVar("Model", bound=BaseModel)


class _KeyTwice(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) < len(pairs):  # rare: find the key given twice, to name it
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _KeyTwice(key)
            seen.add(key)
    return found


def parse_body(model: type[Model], body: bytes) -> Model:
    """``body`` as ``model``, read strictly; ``ApiError`` 422 ``invalid_request`` naming what
    is wrong."""
    try:
        value = json.loads(body, object_pairs_hook=_once_each)
    except _KeyTwice as twice:
        raise ApiError(422, ApiRefusal.INVALID_REQUEST, f"body.{twice.key}: given twice") from None
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deep
        raise ApiError(422, ApiRefusal.INVALID_REQUEST, "body: not valid JSON") from None
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        located = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise ApiError(422, ApiRefusal.INVALID_REQUEST, validation_message(located)) from None


def strict_body(model: type[Model]) -> Any:
    """A FastAPI dependency: the request's body as ``model``, read by ``parse_body``. Declare
    the body in the schema with ``body_schema(model)``: the framework does not read it."""

    async def read(request: Request) -> Model:
        return parse_body(model, await request.body())

    return read


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """A route's ``openapi_extra`` declaring ``model`` as its required JSON body."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }
