"""The query parameters of a list that pages, and its cursors.

A cursor is opaque to clients: base64url of where the previous page stopped (an id, or a time
and an id), so a list may change what it pages by without changing its parameters. One that
does not decode is 422 ``invalid_request``, as any other bad parameter, and nothing is read.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Annotated, TypeVar

from fastapi import Query

from seckill.api.errors import ApiError
from seckill.domain.outcomes import ApiRefusal
from seckill.domain.rules import MAX_ID
from seckill.services.paging import DEFAULT_PAGE, MAX_PAGE

T = TypeVar("T")

Cursor = Annotated[
    str | None,
    Query(max_length=200, description="The `next_cursor` of the previous page (opaque)."),
]
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE, description="At most this many, newest first.")]
DEFAULT_LIMIT = DEFAULT_PAGE


def encode_cursor(position: str) -> str:
    """The cursor for a position (unpadded base64url)."""
    return base64.urlsafe_b64encode(position.encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None, parse: Callable[[str], T]) -> T | None:
    """The position a cursor holds (None for no cursor: the first page); 422 for one this API
    did not give (``parse`` raises ValueError for a position it cannot be)."""
    if cursor is None:
        return None
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
        return parse(text)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ApiError(
            422,
            ApiRefusal.INVALID_REQUEST,
            "cursor: not a cursor this list gave (pass the previous page's next_cursor as is)",
        ) from None


def id_position(text: str) -> int:
    """An id, as a cursor of a list paged by id holds it."""
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MAX_ID:
        raise ValueError(text)
    return int(text)


def id_cursor(item_id: int | None) -> str | None:
    return None if item_id is None else encode_cursor(str(item_id))
