"""The operator's console at ``/console``: pages served by the API, a client of ``/admin/``.

Each page is a Jinja2 template (``api/console/``, shipped in the package) rendered
with no data at all: the page's script (``api/console/static/console.js``) asks the
admin API for it with the admin key the operator entered, so a page served to
anyone holds nothing, and the page can do nothing the API does not (every button is
one admin call). No Node, no build step: the files are served as they are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, FastAPI
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, select_autoescape

from api.errors import NotFound

HERE = Path(__file__).resolve().parent.parent / "console"

#: The pages, in the order the navigation shows them: (name, label).
PAGES = (
    ("pool", "Pool"),
    ("queue", "Queue"),
    ("tenants", "Tenants"),
    ("keys", "Keys"),
    ("batches", "Batches"),
    ("policy", "Policy"),
    ("audit", "Audit"),
)

#: How often a page asks for its data again (ms), one call at a time, while visible.
POLL_MS = 1000
#: The most rows a list shows, and the most tokens of a request (the latest).
ROWS_SHOWN = 100
TOKENS_SHOWN = 2000

#: A page runs only its own script and style, and no other site may frame it.
HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
    "X-Frame-Options": "DENY",
}

router = APIRouter(include_in_schema=False)
_templates = Environment(loader=FileSystemLoader(HERE), autoescape=select_autoescape(["html"]))


def _render(page: str, title: str, **extra: str) -> HTMLResponse:
    html = _templates.get_template(f"{page}.html").render(
        page=page,
        title=title,
        pages=PAGES,
        poll_ms=POLL_MS,
        rows_shown=ROWS_SHOWN,
        tokens_shown=TOKENS_SHOWN,
        **extra,
    )
    return HTMLResponse(html, headers=HEADERS)


@router.get("/console")
async def index() -> RedirectResponse:
    return RedirectResponse("/console/pool")


@router.get("/console/requests/{request_id}")
async def request_page(
    request_id: Annotated[str, PathParam(min_length=1, max_length=64)],
) -> HTMLResponse:
    return _render("request", f"Request {request_id}", request_id=request_id)


@router.get("/console/{page}")
async def page(page: str) -> HTMLResponse:
    titles = dict(PAGES)
    if page not in titles:
        raise NotFound(f"no console page '{page}'", code="not_found")
    return _render(page, titles[page])


def install(app: FastAPI) -> None:
    app.mount("/console/static", StaticFiles(directory=HERE / "static"), name="console-static")
    app.include_router(router)
