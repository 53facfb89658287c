"""Request bodies, read strictly: one JSON object, each key once, each value of its own type.

A lenient reader takes ``{"quantity": 1, "quantity": 3}`` as its last key, and ``"1"``,
``true`` or ``1.0`` as the number 1. A client or a payment provider whose parser reads the first
key, or sends a string, would then disagree with us about what it sent. So a key given twice is
a 422 naming it, and the models' integer fields take JSON integers only (``StrictInt``).

Every body is read one way, here, by the lean routes and the framework's alike: it must come as
``Content-Type: application/json`` (``; charset=utf-8`` allowed, no other parameter), else 415
``unsupported_media_type``; and it must be UTF-8 with no byte order mark, decoded strictly before
it is parsed. ``json.loads`` given bytes guesses UTF-16 or UTF-32 from the first bytes, so a proxy
or firewall reading the body as UTF-8 would see another request than the one we act on.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
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


_JSON = b"application/json"
_UTF8 = frozenset({b"utf-8", b'"utf-8"'})
_NOT_JSON = "body: send it with Content-Type: application/json (charset utf-8, if one is named)"


def _unsupported() -> ApiError:
    return ApiError(415, ApiRefusal.UNSUPPORTED_MEDIA_TYPE, _NOT_JSON)


def check_media_type(content_type: bytes | None) -> None:
    """``content_type`` is JSON in UTF-8; else ``ApiError`` 415 ``unsupported_media_type``."""
    if content_type == _JSON:  # what nearly every client sends: one comparison
        return
    if content_type is None:
        raise _unsupported()
    media, _, parameters = content_type.partition(b";")
    if media.strip().lower() != _JSON:
        raise _unsupported()
    for parameter in parameters.split(b";"):
        name, equals, value = parameter.partition(b"=")
        if not (name or equals or value).strip():
            continue  # "application/json;": an empty parameter says nothing
        if name.strip().lower() != b"charset" or value.strip().lower() not in _UTF8:
            raise _unsupported()


def _encoding_refused(body: bytes) -> ApiError:
    # The guess only names what was sent: nothing is read with it.
    guessed = json.detect_encoding(body)
    named = next((n for n in ("UTF-16", "UTF-32") if guessed.startswith(n.lower())), None)
    refused = "" if named is None else f" ({named} is refused)"
    return ApiError(422, ApiRefusal.INVALID_REQUEST, f"body: not UTF-8{refused}")


def parse_body(model: type[Model], body: bytes, content_type: bytes | None) -> Model:
    """``body`` as ``model``, read strictly; ``ApiError`` 415 ``unsupported_media_type`` unless
    ``content_type`` is JSON, 422 ``invalid_request`` naming what is wrong."""
    check_media_type(content_type)
    try:
        text = body.decode("utf-8")  # strict: a byte that is not UTF-8 is refused, not replaced
    except UnicodeDecodeError:
        raise _encoding_refused(body) from None
    if text.startswith("\ufeff"):
        raise ApiError(422, ApiRefusal.INVALID_REQUEST, "body: UTF-8 with a byte order mark")
    try:
        value = json.loads(text, object_pairs_hook=_once_each)
    except _KeyTwice as twice:
        raise ApiError(422, ApiRefusal.INVALID_REQUEST, f"body.{twice.key}: given twice") from None
    except (ValueError, RecursionError):  # not JSON, nested too deep
        if "\x00" in text:  # JSON never holds a raw NUL; UTF-16 or UTF-32 without a BOM does
            raise _encoding_refused(body) from None
        raise ApiError(422, ApiRefusal.INVALID_REQUEST, "body: not valid JSON") from None
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        located = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise ApiError(422, ApiRefusal.INVALID_REQUEST, validation_message(located)) from None


def content_type_of(headers: Mapping[str, str]) -> bytes | None:
    """The framework's request's ``Content-Type``, as the lean routes read it (raw bytes)."""
    value = headers.get("content-type")
    return None if value is None else value.encode("latin-1")


def strict_body(model: type[Model]) -> Any:
    """A FastAPI dependency: the request's body as ``model``, read by ``parse_body``. Declare
    the body in the schema with ``body_schema(model)``: the framework does not read it."""

    async def read(request: Request) -> Model:
        return parse_body(model, await request.body(), content_type_of(request.headers))

    return read


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """A route's ``openapi_extra`` declaring ``model`` as its required JSON body."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": model.model_json_schema()}},
        }
    }
