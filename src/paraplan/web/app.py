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
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from paraplan.specs import ConfigError, InternalError, format_validation_error
from paraplan.units import UnitError
from paraplan.web import forms
from paraplan.web.state import MAX_UPLOAD_BYTES, Predictions, Searches, Uploads, plot_lock

#: Largest JSON body of a form (the model mapping is its longest field).
MAX_FORM_BYTES = 128 * 1024
PICTURES = ("breakdown", "timeline", "memory")
PREDICT_FIELDS = (*tuple(f.name for f in forms.JOB_FLAGS), "model_yaml", "cluster_yaml", "interval")
HEADER = "x-paraplan"

_HERE = Path(__file__).parent


class BadInput(Exception):
    """A 400 answer: the one-line message and the field it names."""

    def __init__(self, message: str, field: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.field, self.status = field, status


def _message(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        return format_validation_error(exc)
    return " ".join(str(exc).split())


def _error(exc: BaseException, fields: tuple[str, ...] = PREDICT_FIELDS, prefix: str = "") -> JSONResponse:
    message = _message(exc)
    field = exc.field if isinstance(exc, BadInput) else forms.field_of(message, fields)
    status = exc.status if isinstance(exc, BadInput) else 500 if isinstance(exc, InternalError) else 400
    return JSONResponse({"error": message, "field": None if field is None else prefix + field}, status_code=status)


USER_ERRORS = (ConfigError, ValidationError, UnitError, InternalError, BadInput)


async def _body(request: Request, limit: int) -> bytes:
    """The request's body, refused past ``limit`` bytes without reading the rest."""
    if request.method == "POST" and request.headers.get(HEADER) != "1":
        raise BadInput("request: a POST to this server carries the X-Paraplan header (sent by its own pages)",
                       status=403)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BadInput(f"upload: larger than the limit of {limit // 1024} KiB", status=413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadInput(f"upload: larger than the limit of {limit // 1024} KiB", status=413)
        chunks.append(chunk)
    return b"".join(chunks)


async def _form(request: Request) -> dict[str, Any]:
    from paraplan.catalog.userdata import load_json

    body = await _body(request, MAX_FORM_BYTES)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput("request: the form is not UTF-8 text") from None
    data = load_json(text or "{}", "the form")
    if not isinstance(data, dict):
        raise BadInput("request: the form is not a JSON object")
    return data


def _draw(request: Request, kept: Any, kind: str) -> bytes | None:
    """The picture ``kind`` of a kept prediction, drawn once (re-rendering the same plan reads
    the drawn one: its key is its JSON's hash)."""
    from paraplan.report.plots import render_png

    with plot_lock():
        if kind in kept.pictures:
            return kept.pictures[kind]
        if _gone(request):
            return None
        png = kept.pictures[kind] = render_png(kept.pred, kind, kept.interval)
        return png


def _gone(request: Request) -> bool:
    """Whether the browser closed the request (checked without waiting)."""
    import anyio.from_thread

    try:
        return anyio.from_thread.run(request.is_disconnected)
    except RuntimeError:  # no event loop to ask (a test calling directly)
        return False


def _json(data: Any) -> Response:
    """``data`` as the CLI writes JSON (``report.formats.render_json``: a non-finite number is
    an internal error, never output)."""
    from paraplan.report.formats import render_json

    return Response(render_json(data), media_type="application/json")


def _path_like(value: Any) -> bool:
    """A value the package would read as a file (a cluster file: a name ending in .yaml, .yml or
    .json); the page takes catalog names only and reads no file of the server's."""
    return isinstance(value, str) and value.strip().lower().endswith((".yaml", ".yml", ".json"))


def _names_cluster(exc: BaseException) -> bool:
    return _message(exc).startswith(("cluster", "unknown GPU"))


def _mapping(text: Any, field: str, what: str) -> dict[str, Any]:
    """A model or cluster typed as YAML on the page, read as a job file is (the package's
    limits: no tags, aliases that cannot blow up, no repeated keys); a value naming a file
    (hf_config, a cluster file) is refused: the page reads no file of the server's."""
    from paraplan.catalog.userdata import load_yaml

    if not isinstance(text, str) or not text.strip():
        raise BadInput(f"{field}: give the {what}", field)
    if len(text) > forms.MAX_FIELD_CHARS:
        raise BadInput(f"{field}: longer than {forms.MAX_FIELD_CHARS:,} characters", field)
    mapping = load_yaml(text, field)
    if not isinstance(mapping, dict):
        raise BadInput(f"{field}: expected a mapping of {what}", field)
    if "hf_config" in mapping:
        raise BadInput(f"{field}: hf_config: upload the config.json instead", field)
    if any(_path_like(value) for value in _strings(mapping)):
        raise BadInput(f"{field}: names a file; the page takes catalog names and values only", field)
    return mapping


def _level(form: dict[str, Any]) -> float:
    """The form's interval level (``--interval``; 0.8 when the field is empty)."""
    from paraplan.uncertainty import check_level

    level = forms.typed("interval", form.get("interval"), float, "--interval")
    return check_level(0.8 if level is None else level)


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


class WebApp:
    """The state of one server and its request handlers."""

    def __init__(self) -> None:
        self.predictions = Predictions()
        self.uploads = Uploads()
        self.searches = Searches()
        self.templates = Environment(loader=PackageLoader("paraplan.web", "templates"),
                                     autoescape=select_autoescape(["html"]))

    # -- pages ------------------------------------------------------------------------------
    def _page(self, name: str, **context: Any) -> HTMLResponse:
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
                                                        choices=choices, **context)
        return HTMLResponse(html)

    async def predict_page(self, request: Request) -> Response:
        return self._page("predict.html")

    async def search_page(self, request: Request) -> Response:
        return self._page("search.html")

    async def compare_page(self, request: Request) -> Response:
        return self._page("compare.html")

    # -- predictions ------------------------------------------------------------------------
    def predict_form(self, form: dict[str, Any]) -> tuple[Any, Any, tuple[str, ...]]:
        """The job a predict form describes (the demo job with the form's fields laid over it,
        as ``paraplan predict`` lays its flags), its prediction and the notes about it."""
        from paraplan.catalog.jobs import demo_job_mapping
        from paraplan.catalog.origin import resolve_with_flags
        from paraplan.cli.loading import predict_flagged

        source = form.get("model_source") or "catalog"
        hf = self.uploads.path(form.get("hf_config")) if source == "hf" else None
        flags = forms.job_flags(form, hf)
        raw = demo_job_mapping()
        raw.pop("train_tokens", None)  # the page's field says it; cleared, the job has none
        if source != "catalog":
            flags["model"] = None
        if source == "mapping":
            raw["model"] = _mapping(form.get("model_yaml"), "model_yaml", "model fields (num_layers, hidden_size, ...)")
        cluster_source = form.get("cluster_source") or "catalog"
        if cluster_source == "mapping":
            for name in ("cluster", "gpu", "num_nodes", "gpus_per_node", "price_per_gpu_hour"):
                flags[name] = None  # the mapping says them
            raw["cluster"] = _mapping(form.get("cluster_yaml"), "cluster_yaml", "cluster fields (gpu, num_nodes, ...)")
        elif cluster_source == "gpu":
            flags["cluster"] = None
            if not flags.get("gpu"):
                raise BadInput("gpu: choose a GPU", "gpu")
        else:
            flags["gpu"] = None
            if _path_like(flags.get("cluster")):
                raise BadInput("cluster: the page takes a catalog cluster name, not a file", "cluster")
        job = resolve_with_flags(raw, flags, hf.parent if hf else self.uploads.root, "the demo job")
        return (job, *predict_flagged(job, "analytical", None, keep_timeline=True))

    def _answer(self, job: Any, pred: Any, notes: list[str] | tuple[str, ...], level: float) -> dict[str, Any]:
        """A prediction as the page takes it: the CLI's ``paraplan predict --format json`` (with
        its interval at ``level``), the CLI's text of every figure, and where its pictures and
        downloads are."""
        from paraplan.cli.loading import prediction_data
        from paraplan.export import TARGETS
        from paraplan.web.shown import prediction_shown

        data, bounds = prediction_data(job, pred, level, "analytical", None)
        key = self.predictions.add(job, pred, bounds, data)
        return {
            "key": key,
            "prediction": data,  # paraplan predict --format json
            "shown": prediction_shown(pred, bounds),
            "notes": list(notes),
            "pictures": {kind: f"/picture/{key}/{kind}.png" for kind in PICTURES},
            "downloads": {"job.yaml": f"/download/{key}/job.yaml", "report.html": f"/download/{key}/report.html",
                          **{t: f"/download/{key}/recipe/{t}" for t in TARGETS}},
        }

    async def predict(self, request: Request) -> Response:
        form: Any = None
        try:
            form = await _form(request)
            level = _level(form)
            job, pred, notes = self.predict_form(form)
            return _json(self._answer(job, pred, notes, level))
        except USER_ERRORS as exc:
            answer = _error(exc)
            source = form.get("model_source") if isinstance(form, dict) else None
            field = json.loads(answer.body).get("field")
            named = {"mapping": "model_yaml", "hf": "hf_config"}.get(str(source))
            if named and field == "model":  # the model comes from there
                return _error(BadInput(_message(exc), named))
            cluster_fields = ("cluster", "gpu", "num_nodes", "gpus_per_node", "price_per_gpu_hour")
            if isinstance(form, dict) and form.get("cluster_source") == "mapping" and (field in cluster_fields or _names_cluster(exc)):
                return _error(BadInput(_message(exc), "cluster_yaml"))
            return answer

    async def upload(self, request: Request) -> Response:
        try:
            data = await _body(request, MAX_UPLOAD_BYTES)
            name = Path(request.query_params.get("name") or "config.json").name[:100]
            return JSONResponse({"id": self.uploads.add(data, name), "name": name})
        except USER_ERRORS as exc:
            return _error(BadInput(_message(exc), "hf_config", getattr(exc, "status", 400)))

    async def picture(self, request: Request) -> Response:
        """A picture of a kept prediction (report.plots), drawn in a worker thread; one the
        page stopped waiting for (a newer change replaced it) is not drawn."""
        from starlette.concurrency import run_in_threadpool

        kind = request.path_params["kind"]
        try:
            if kind not in PICTURES:
                raise BadInput(f"picture: unknown kind {kind!r} (one of {', '.join(PICTURES)})", status=404)
            kept = self.predictions.get(request.path_params["key"])
            png = await run_in_threadpool(_draw, request, kept, kind)
        except USER_ERRORS as exc:
            return _error(exc)
        if png is None:
            return Response(status_code=204)
        return Response(png, media_type="image/png", headers={"Cache-Control": "private, max-age=3600"})

    def download(self, request: Request) -> Response:
        what = request.path_params["what"]
        try:
            text, name, media = self._download(self.predictions.get(request.path_params["key"]), what)
        except USER_ERRORS as exc:
            return _error(exc)
        return Response(text, media_type=media, headers={"Content-Disposition": f'attachment; filename="{name}"'})

    def _download(self, kept: Any, what: str) -> tuple[str, str, str]:
        from paraplan.export import TARGETS, render

        pred = kept.pred
        stem = "".join(c if c.isalnum() or c in "-_." else "-" for c in pred.job.name)[:60] or "job"
        if what == "job.yaml":
            import yaml

            from paraplan.catalog.jobfile import job_mapping

            text = "# written by paraplan serve; run `paraplan predict` or `paraplan export` on it\n"
            text += yaml.safe_dump(job_mapping(pred.job), sort_keys=False, default_flow_style=None)
            return text, f"{stem}.yaml", "application/yaml"
        if what == "report.html":
            from paraplan.report.html import render_html

            with plot_lock():
                return render_html(pred, kept.interval), f"{stem}-report.html", "text/html"
        target = what.removeprefix("recipe/")
        if target not in TARGETS:
            raise BadInput(f"target: unknown export target {target!r} (one of: {', '.join(TARGETS)})", status=404)
        suffix = {"megatron": ".sh", "deepspeed": ".json", "torchtitan": ".py", "slurm": ".sbatch"}[target]
        return render(target, pred.job, pred), f"{stem}-{target}{suffix}", "text/plain"

    # -- compare ----------------------------------------------------------------------------
    async def compare(self, request: Request) -> Response:
        from paraplan.cli.compare import comparison_data
        from paraplan.cli.loading import pair_intervals
        from paraplan.prediction.compare import compare_predictions
        from paraplan.web.shown import comparison_shown

        try:
            form = await _form(request)
            level = _level(form)
            a = self.predictions.get(str(form.get("a")))
            b = self.predictions.get(str(form.get("b")))
            comparison = compare_predictions(a.pred, b.pred)
            bounds = pair_intervals(a.job, b.job, a.pred, b.pred, level, "analytical", None)
            return _json({"comparison": comparison_data(comparison, bounds),  # paraplan compare --format json
                          "shown": comparison_shown(comparison, bounds)})
        except USER_ERRORS as exc:
            return _error(exc)

    # -- search -----------------------------------------------------------------------------
    async def search_start(self, request: Request) -> Response:
        from dataclasses import fields

        from paraplan.search.request import SearchFlags, SearchRequest

        names = (*tuple(f.name for f in fields(SearchFlags)), "top")
        form: Any = None
        try:
            form = await _form(request)
            for name in ("cluster", "clusters"):
                if _path_like(form.get(name)):
                    raise BadInput(f"{name}: the page takes catalog cluster names, not files", name)
            hf = self.uploads.path(form.get("hf_config")) if form.get("model_source") == "hf" else None
            if hf is not None:
                form = {**form, "model": None}
            source = form.get("cluster_source") or "catalog"
            job_file = None
            if source == "mapping":  # the cluster's fields: a job file of them in the temporary folder
                cluster = _mapping(form.get("cluster_yaml"), "cluster_yaml", "cluster fields (gpu, num_nodes, ...)")
                job_file = self.uploads.job_file(cluster)
                form = {**form, "cluster": None, "gpu": None, "num_nodes": None, "price_per_gpu_hour": None}
            form = {**form, **({"cluster": None} if source == "gpu" else {"gpu": None})}
            flags = forms.search_flags(form, hf)
            top = forms.typed("top", form.get("top"), int, "--top") or 10
            if top < 1:
                raise BadInput(f"top: expected a positive whole number, got {top}", "top")
            level = _level(form)
            risk = bool(forms.typed("risk", form.get("risk"), bool, "--risk"))
            request_ = SearchRequest.from_flags(job_file, flags)
            key = self.searches.start(request_, min(top, 200), level, risk)
            return JSONResponse({"id": key, "notes": list(request_.notes),
                                 "configurations": request_.num_configurations})
        except USER_ERRORS as exc:
            answer = _error(exc, (*names, "interval", "risk", "cluster_yaml"))
            if isinstance(form, dict) and form.get("cluster_source") == "mapping" and not isinstance(exc, BadInput) \
                    and (json.loads(answer.body).get("field") in ("cluster", "gpu", "num_nodes", None)
                         or _names_cluster(exc)):
                return _error(BadInput(_message(exc), "cluster_yaml"))
            return answer

    async def search_status(self, request: Request) -> Response:
        try:
            run = self.searches.get(request.path_params["key"])
        except USER_ERRORS as exc:
            return _error(exc)
        import time

        elapsed = run.elapsed_s if run.state != "running" else time.monotonic() - run.started
        answer: dict[str, Any] = {"state": run.state, "stage": run.stage, "configuration": run.index + 1,
                                  "configurations": len(run.request.searches), "done": run.done,
                                  "elapsed_s": elapsed, "error": run.error}
        if run.state == "done":
            answer["result"] = run.data  # paraplan search --format json
            answer["shown"] = run.shown  # its plan tables as the CLI prints them
            if run.pareto_png is not None:
                answer["pareto_picture"] = f"/search/{request.path_params['key']}/pareto.png"
        return _json(answer)

    async def search_cancel(self, request: Request) -> Response:
        try:
            await _body(request, 1024)
            run = self.searches.get(request.path_params["key"])
        except USER_ERRORS as exc:
            return _error(exc)
        run.cancel.set()
        return JSONResponse({"state": "cancelling" if run.state == "running" else run.state})

    async def search_pareto(self, request: Request) -> Response:
        try:
            run = self.searches.get(request.path_params["key"])
            if run.pareto_png is None:
                raise BadInput("pareto: this search has no Pareto picture", status=404)
        except USER_ERRORS as exc:
            return _error(exc)
        return Response(run.pareto_png, media_type="image/png")

    def search_plan(self, request: Request) -> Response:
        """Plan ``rank`` (1: the best) of a finished search, predicted as the predict page does."""
        from paraplan.prediction.entry import predict_any

        try:
            run = self.searches.get(request.path_params["key"])
            which, index = request.path_params["which"], int(request.path_params["index"])
            plans = run.plans if which == "plans" else run.front
            if run.state != "done" or not 0 <= index < len(plans):
                raise BadInput(f"plan: no plan {index} in this search", status=404)
            plan = plans[index]
            job = plan.placement.job if plan.placement is not None else plan.job
            pred = predict_any(job, keep_timeline=True)
            return _json({**self._answer(job, pred, [], run.level), "fields": {**forms.fields_of(pred.job), "interval": f"{run.level:g}"}})
        except USER_ERRORS as exc:
            return _error(exc)

    async def close(self) -> None:
        self.searches.cancel_all()
        self.uploads.close()


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
    web = WebApp()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        web._answer(*web.predict_form({}), 0.8)  # the demo job once: imports and the catalog read before the first page asks
        yield
        await web.close()

    routes = [
        Route("/", web.predict_page),
        Route("/search", web.search_page),
        Route("/compare", web.compare_page),
        Route("/api/predict", web.predict, methods=["POST"]),
        Route("/api/upload", web.upload, methods=["POST"]),
        Route("/api/compare", web.compare, methods=["POST"]),
        Route("/api/search", web.search_start, methods=["POST"]),
        Route("/api/search/{key}", web.search_status),
        Route("/api/search/{key}/cancel", web.search_cancel, methods=["POST"]),
        Route("/api/search/{key}/{which:str}/{index:int}", web.search_plan, methods=["POST"]),
        Route("/search/{key}/pareto.png", web.search_pareto),
        Route("/picture/{key}/{kind}.png", web.picture),
        Route("/download/{key}/{what:path}", web.download),
        Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
    ]
    hosts = allowed_hosts or ["127.0.0.1", "localhost", "::1"]
    app = Starlette(routes=routes, lifespan=lifespan,
                    middleware=[Middleware(SecurityHeaders), Middleware(HostCheck, allowed_hosts=hosts)])
    app.state.web = web
    return app
