"""The predict and compare routes: the job a predict form describes, resolved as ``paraplan
predict`` resolves its flags and predicted by the package (its answer: the CLI's ``--format
json`` with its interval, the CLI's text of every figure, and where its pictures and downloads
are); an uploaded Hugging Face config; two kept predictions compared as ``paraplan compare``
compares them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from paraplan.web import forms
from paraplan.web.answers import (
    USER_ERRORS,
    BadInput,
    error,
    json_answer,
    level,
    mapping,
    message,
    names_cluster,
    path_like,
    read_body,
    read_form,
)
from paraplan.web.download_routes import PICTURES
from paraplan.web.server import Server
from paraplan.web.state import MAX_UPLOAD_BYTES


def predict_form(server: Server, form: dict[str, Any]) -> tuple[Any, Any, tuple[str, ...]]:
    """The job a predict form describes (the demo job with the form's fields laid over it,
    as ``paraplan predict`` lays its flags), its prediction and the notes about it."""
    from paraplan.catalog.jobs import demo_for_flags, demo_job_mapping
    from paraplan.catalog.origin import resolve_with_flags
    from paraplan.cli.loading import predict_flagged

    source = form.get("model_source") or "catalog"
    hf = server.uploads.path(form.get("hf_config")) if source == "hf" else None
    flags = forms.job_flags(form, hf)
    raw = demo_job_mapping()
    raw.pop("train_tokens", None)  # the page's field says it; cleared, the job has none
    if source != "catalog":
        flags["model"] = None
    if source == "mapping":
        raw["model"] = mapping(form.get("model_yaml"), "model_yaml", "model fields (num_layers, hidden_size, ...)")
    cluster_source = form.get("cluster_source") or "catalog"
    if cluster_source == "mapping":
        for name in ("cluster", "gpu", "num_nodes", "gpus_per_node", "price_per_gpu_hour"):
            flags[name] = None  # the mapping says them
        raw["cluster"] = mapping(form.get("cluster_yaml"), "cluster_yaml", "cluster fields (gpu, num_nodes, ...)")
    elif cluster_source == "gpu":
        flags["cluster"] = None
        if not flags.get("gpu"):
            raise BadInput("gpu: choose a GPU", "gpu")
    else:
        flags["gpu"] = None
        if path_like(flags.get("cluster")):
            raise BadInput("cluster: the page takes a catalog cluster name, not a file", "cluster")
    raw = demo_for_flags(raw, flags)  # as `paraplan predict` reads the demo job: its values are an example
    job = resolve_with_flags(raw, flags, hf.parent if hf else server.uploads.root, "the demo job")
    return (job, *predict_flagged(job, "analytical", None, keep_timeline=True))


def answer(server: Server, job: Any, pred: Any, notes: list[str] | tuple[str, ...], at: float) -> dict[str, Any]:
    """A prediction as the page takes it: the CLI's ``paraplan predict --format json`` (with
    its interval at level ``at``), the CLI's text of every figure, and where its pictures and
    downloads are."""
    from paraplan.cli.loading import prediction_data
    from paraplan.export import TARGETS
    from paraplan.web.shown import prediction_shown

    data, bounds = prediction_data(job, pred, at, "analytical", None)
    key = server.predictions.add(job, pred, bounds, data)
    return {
        "key": key,
        "prediction": data,  # paraplan predict --format json
        "shown": prediction_shown(pred, bounds),
        "notes": list(notes),
        "pictures": {kind: f"/picture/{key}/{kind}.png" for kind in PICTURES},
        "downloads": {"job.yaml": f"/download/{key}/job.yaml", "report.html": f"/download/{key}/report.html",
                      **{t: f"/download/{key}/recipe/{t}" for t in TARGETS}},
    }


async def predict(server: Server, request: Request) -> Response:
    form: Any = None
    try:
        form = await read_form(request)
        at = level(form)
        job, pred, notes = predict_form(server, form)
        return json_answer(answer(server, job, pred, notes, at))
    except USER_ERRORS as exc:
        said = error(exc)
        source = form.get("model_source") if isinstance(form, dict) else None
        field = json.loads(said.body).get("field")
        named = {"mapping": "model_yaml", "hf": "hf_config"}.get(str(source))
        if named and field == "model":  # the model comes from there
            return error(BadInput(message(exc), named))
        cluster_fields = ("cluster", "gpu", "num_nodes", "gpus_per_node", "price_per_gpu_hour")
        if isinstance(form, dict) and form.get("cluster_source") == "mapping" and (field in cluster_fields or names_cluster(exc)):
            return error(BadInput(message(exc), "cluster_yaml"))
        return said


async def upload(server: Server, request: Request) -> Response:
    try:
        data = await read_body(request, MAX_UPLOAD_BYTES)
        name = Path(request.query_params.get("name") or "config.json").name[:100]
        return JSONResponse({"id": server.uploads.add(data, name), "name": name})
    except USER_ERRORS as exc:
        return error(BadInput(message(exc), "hf_config", getattr(exc, "status", 400)))


async def compare(server: Server, request: Request) -> Response:
    from paraplan.cli.compare import comparison_data
    from paraplan.cli.loading import pair_intervals
    from paraplan.prediction.compare import compare_predictions
    from paraplan.web.shown import comparison_shown

    try:
        form = await read_form(request)
        at = level(form)
        a = server.predictions.get(str(form.get("a")))
        b = server.predictions.get(str(form.get("b")))
        comparison = compare_predictions(a.pred, b.pred)
        bounds = pair_intervals(a.job, b.job, a.pred, b.pred, at, "analytical", None)
        return json_answer({"comparison": comparison_data(comparison, bounds),  # paraplan compare --format json
                            "shown": comparison_shown(comparison, bounds)})
    except USER_ERRORS as exc:
        return error(exc)
