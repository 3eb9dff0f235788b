"""The downloads of a kept prediction: its pictures (``report.plots``, drawn once in a worker
thread), its job YAML, its launch recipes (``export``) and its HTML report."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from paraplan.web.answers import USER_ERRORS, BadInput, error
from paraplan.web.server import Server
from paraplan.web.state import plot_lock

PICTURES = ("breakdown", "timeline", "memory")


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


async def picture(server: Server, request: Request) -> Response:
    """A picture of a kept prediction (report.plots), drawn in a worker thread; one the
    page stopped waiting for (a newer change replaced it) is not drawn."""
    from starlette.concurrency import run_in_threadpool

    kind = request.path_params["kind"]
    try:
        if kind not in PICTURES:
            raise BadInput(f"picture: unknown kind {kind!r} (one of {', '.join(PICTURES)})", status=404)
        kept = server.predictions.get(request.path_params["key"])
        png = await run_in_threadpool(_draw, request, kept, kind)
    except USER_ERRORS as exc:
        return error(exc)
    if png is None:
        return Response(status_code=204)
    return Response(png, media_type="image/png", headers={"Cache-Control": "private, max-age=3600"})


def download(server: Server, request: Request) -> Response:
    what = request.path_params["what"]
    try:
        text, name, media = _download(server.predictions.get(request.path_params["key"]), what)
    except USER_ERRORS as exc:
        return error(exc)
    return Response(text, media_type=media, headers={"Content-Disposition": f'attachment; filename="{name}"'})


def _download(kept: Any, what: str) -> tuple[str, str, str]:
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
