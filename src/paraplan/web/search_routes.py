"""The search routes: a search started from the page's form (the search request of ``paraplan
search``, run in a thread), its progress, its cancelling, its answer (the CLI's ``--format
json`` and its Pareto picture) and any of its plans predicted as the predict page predicts."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from paraplan.web import answers, forms
from paraplan.web.answers import USER_ERRORS, BadInput, error
from paraplan.web.predict_routes import answer
from paraplan.web.server import Server


async def search_start(server: Server, request: Request) -> Response:
    from dataclasses import fields

    from paraplan.search.request import SearchFlags, SearchRequest

    names = (*tuple(f.name for f in fields(SearchFlags)), "top")
    form: Any = None
    try:
        form = await answers.read_form(request)
        for name in ("cluster", "clusters"):
            if answers.path_like(form.get(name)):
                raise BadInput(f"{name}: the page takes catalog cluster names, not files", name)
        hf = server.uploads.path(form.get("hf_config")) if form.get("model_source") == "hf" else None
        if hf is not None:
            form = {**form, "model": None}
        source = form.get("cluster_source") or "catalog"
        job_file = None
        if source == "mapping":  # the cluster's fields: a job file of them in the temporary folder
            cluster = answers.mapping(form.get("cluster_yaml"), "cluster_yaml", "cluster fields (gpu, num_nodes, ...)")
            job_file = server.uploads.job_file(cluster)
            form = {**form, "cluster": None, "gpu": None, "num_nodes": None, "price_per_gpu_hour": None}
        form = {**form, **({"cluster": None} if source == "gpu" else {"gpu": None})}
        flags = forms.search_flags(form, hf)
        top = forms.typed("top", form.get("top"), int, "--top") or 10
        if top < 1:
            raise BadInput(f"top: expected a positive whole number, got {top}", "top")
        at = answers.level(form)
        risk = bool(forms.typed("risk", form.get("risk"), bool, "--risk"))
        request_ = SearchRequest.from_flags(job_file, flags)
        key = server.searches.start(request_, min(top, 200), at, risk)
        return JSONResponse({"id": key, "notes": list(request_.notes),
                             "configurations": request_.num_configurations})
    except USER_ERRORS as exc:
        said = error(exc, (*names, "interval", "risk", "cluster_yaml"))
        if isinstance(form, dict) and form.get("cluster_source") == "mapping" and not isinstance(exc, BadInput) \
                and (json.loads(said.body).get("field") in ("cluster", "gpu", "num_nodes", None)
                     or answers.names_cluster(exc)):
            return error(BadInput(answers.message(exc), "cluster_yaml"))
        return said


async def search_status(server: Server, request: Request) -> Response:
    try:
        run = server.searches.get(request.path_params["key"])
    except USER_ERRORS as exc:
        return error(exc)
    import time

    elapsed = run.elapsed_s if run.state != "running" else time.monotonic() - run.started
    said: dict[str, Any] = {"state": run.state, "stage": run.stage, "configuration": run.index + 1,
                            "configurations": len(run.request.searches), "done": run.done,
                            "elapsed_s": elapsed, "error": run.error}
    if run.state == "done":
        said["result"] = run.data  # paraplan search --format json
        said["shown"] = run.shown  # its plan tables as the CLI prints them
        if run.pareto_png is not None:
            said["pareto_picture"] = f"/search/{request.path_params['key']}/pareto.png"
    return answers.json_answer(said)


async def search_cancel(server: Server, request: Request) -> Response:
    try:
        await answers.read_body(request, 1024)
        run = server.searches.get(request.path_params["key"])
    except USER_ERRORS as exc:
        return error(exc)
    run.cancel.set()
    return JSONResponse({"state": "cancelling" if run.state == "running" else run.state})


async def search_pareto(server: Server, request: Request) -> Response:
    try:
        run = server.searches.get(request.path_params["key"])
        if run.pareto_png is None:
            raise BadInput("pareto: this search has no Pareto picture", status=404)
    except USER_ERRORS as exc:
        return error(exc)
    return Response(run.pareto_png, media_type="image/png")


def search_plan(server: Server, request: Request) -> Response:
    """Plan ``rank`` (1: the best) of a finished search, predicted as the predict page does."""
    from paraplan.prediction.entry import predict_any

    try:
        run = server.searches.get(request.path_params["key"])
        which, index = request.path_params["which"], int(request.path_params["index"])
        plans = run.plans if which == "plans" else run.front
        if run.state != "done" or not 0 <= index < len(plans):
            raise BadInput(f"plan: no plan {index} in this search", status=404)
        plan = plans[index]
        job = plan.placement.job if plan.placement is not None else plan.job
        pred = predict_any(job, keep_timeline=True)
        return answers.json_answer({**answer(server, job, pred, [], run.level),
                            "fields": {**forms.fields_of(pred.job), "interval": f"{run.level:g}"}})
    except USER_ERRORS as exc:
        return error(exc)
