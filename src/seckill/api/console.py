"""The operator's console (``/admin``): the items and their stages, creating, warming, auditing,
repairing and archiving one, dead letters and refunds owed. One file that needs no network but
this server; every action it takes is a call of the admin API with the operator's token, which
stays in the tab (a ``#token=`` fragment or a field) and goes only in the Authorization header.
"""

from __future__ import annotations

from functools import cache
from string import Template

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from seckill.pages import PAGE_HEADERS, inline, page_fields, static_text

router = APIRouter()


@router.get("/admin", include_in_schema=False, response_class=HTMLResponse)
async def console_page() -> HTMLResponse:
    return HTMLResponse(render_page(), headers=PAGE_HEADERS)


@cache
def render_page() -> str:
    """The page, with its script inlined."""
    return Template(static_text("console.html")).substitute(
        **page_fields(), console_js=inline(static_text("console.js"), "script")
    )
