"""The web app of ``paraplan serve``: server-rendered pages (Jinja2) and a small JSON API
(Starlette). Every answer comes from the package's API: the job a form describes is resolved
as ``paraplan predict`` resolves its flags, predicted by ``predict_any``, searched by the
search request of ``paraplan search``, drawn by ``report.plots`` and exported by ``export``;
the JSON it sends is the CLI's ``--format json``. Bad input answers 400 with the package's
one-line message and the form field it names.

Safe by default: ``paraplan serve`` binds 127.0.0.1; requests must name this server as their
Host (no DNS rebinding) and every POST carries the ``X-Paraplan`` header (a page elsewhere
cannot send it without the browser asking first, which this server never allows); uploads are
size-limited, read with the package's limits for user files and kept in one temporary folder;
nothing uploaded is executed.

This module: the app (its pages, its routes and its middleware: the security headers and the
Host check); the routes are in ``predict_routes`` (predict, upload, compare), ``search_routes``
(start, progress, cancel, results) and ``download_routes`` (pictures, job YAML, recipes,
report); how a request is read and answered (the X-Paraplan header, size limits, errors) is
in ``answers``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from paraplan.web import download_routes, predict_routes, search_routes
from paraplan.web.server import Server

_HERE = Path(__file__).parent


class Pages:
    """The three pages (server-rendered templates), with the choices their fields offer."""

    def __init__(self) -> None:
        self.templates = Environment(loader=PackageLoader("paraplan.web", "templates"),
                                     autoescape=select_autoescape(["html"]))

    def render(self, name: str) -> HTMLResponse:
        from paraplan._version import __version__
        from paraplan.catalog.loader import catalog_names
        from paraplan.export import TARGETS
        from paraplan.specs import FP8Recipe, Framework, Precision, Schedule

        choices = {
            "models": catalog_names("models"), "clusters": catalog_names("clusters"), "gpus": catalog_names("gpus"),
            "precisions": [p.value for p in Precision], "schedules": [s.value for s in Schedule],
            "frameworks": [f.value for f in Framework], "fp8_recipes": [r.value for r in FP8Recipe],
            "recomputes": ["none", "selective", "full", "layer", "op"], "targets": TARGETS,
        }
        html = self.templates.get_template(name).render(version=__version__, page=name.removesuffix(".html"),
                                                        choices=choices)
        return HTMLResponse(html)

    def page(self, name: str) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            return self.render(name)

        return endpoint


class SecurityHeaders:
    """Every answer: scripts, styles and pictures from this server only, no framing, no
    sniffing, no referrer (pure ASGI, so streaming answers pass through untouched)."""

    HEADERS = (
        (b"content-security-policy", b"default-src 'self'; img-src 'self' data:; object-src 'none'; "
                                     b"frame-ancestors 'none'; base-uri 'none'; form-action 'self'"),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"no-referrer"),
        (b"x-frame-options", b"DENY"),
    )

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *self.HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


def host_of(header: str | None) -> str | None:
    """The host name of a Host header, lowercased, brackets off an IPv6 address:
    ``[::1]:8000`` -> ``::1``, ``localhost:8000`` -> ``localhost``; None for a malformed one."""
    import re

    match = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d{1,5}))?|([A-Za-z0-9.\-]+)(?::(\d{1,5}))?", (header or "").strip())
    if match is None:
        return None
    return (match.group(1) or match.group(3)).lower()


class HostCheck:
    """Requests must name an allowed host (no DNS rebinding: a page elsewhere cannot reach this
    server through a name of its own); IPv6 hosts in their bracketed form (``[::1]:8000``)."""

    def __init__(self, app: Any, allowed_hosts: list[str]) -> None:
        self.app = app
        self.any = "*" in allowed_hosts
        self.allowed = {h.strip("[]").lower() for h in allowed_hosts}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self.any or scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        header = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
        if host_of(header) not in self.allowed:
            await Response("Invalid host header", status_code=400, media_type="text/plain")(scope, receive, send)
            return
        await self.app(scope, receive, send)


def create_app(allowed_hosts: list[str] | None = None) -> Starlette:
    """The Starlette app; ``allowed_hosts``: the Host names requests may carry (the address the
    server binds, localhost and 127.0.0.1 by default; "*" for any)."""
    server, pages = Server(), Pages()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # the demo job once: imports and the catalog read before the first page asks
        predict_routes.answer(server, *predict_routes.predict_form(server, {}), 0.8)
        yield
        server.close()

    def on(route: Callable[..., Any]) -> Callable[[Request], Any]:
        return partial(route, server)

    routes = [
        Route("/", pages.page("predict.html")),
        Route("/search", pages.page("search.html")),
        Route("/compare", pages.page("compare.html")),
        Route("/api/predict", on(predict_routes.predict), methods=["POST"]),
        Route("/api/upload", on(predict_routes.upload), methods=["POST"]),
        Route("/api/compare", on(predict_routes.compare), methods=["POST"]),
        Route("/api/search", on(search_routes.search_start), methods=["POST"]),
        Route("/api/search/{key}", on(search_routes.search_status)),
        Route("/api/search/{key}/cancel", on(search_routes.search_cancel), methods=["POST"]),
        Route("/api/search/{key}/{which:str}/{index:int}", on(search_routes.search_plan), methods=["POST"]),
        Route("/search/{key}/pareto.png", on(search_routes.search_pareto)),
        Route("/picture/{key}/{kind}.png", on(download_routes.picture)),
        Route("/download/{key}/{what:path}", on(download_routes.download)),
        Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
    ]
    hosts = allowed_hosts or ["127.0.0.1", "localhost", "::1"]
    app = Starlette(routes=routes, lifespan=lifespan,
                    middleware=[Middleware(SecurityHeaders), Middleware(HostCheck, allowed_hosts=hosts)])
    app.state.server = server
    return app
