"""The buyers' waiting page (``/wait/{item_id}``): join the item's waiting room, watch one's place
come up, and buy when let in. One file that needs no network but this server; the buyer's token
stays in the tab (a ``#token=`` fragment or a field) and goes only in the Authorization header.
"""

from __future__ import annotations

from functools import cache
from string import Template

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from seckill.api.paths import ItemId
from seckill.pages import PAGE_HEADERS, inline, page_fields, static_text

router = APIRouter()


@router.get("/wait/{item_id}", include_in_schema=False, response_class=HTMLResponse)
async def waiting_page(item_id: ItemId) -> HTMLResponse:
    # The page reads its item from its own address; the id is checked here all the same.
    return HTMLResponse(render_page(), headers=PAGE_HEADERS)


@cache
def render_page() -> str:
    """The page, with its script inlined."""
    return Template(static_text("wait.html")).substitute(
        **page_fields(), wait_js=inline(static_text("wait.js"), "script")
    )
