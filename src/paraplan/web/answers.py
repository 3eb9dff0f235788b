"""How the server reads a request and answers it: the body (refused without the X-Paraplan
header on a POST, or past its size limit), the form (a JSON object read with the package's
limits for user files), the fields a form may type (a model or cluster as YAML, the interval
level), and the answers (the CLI's JSON; a 400 with the package's one-line message and the
form field it names)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from paraplan.specs import ConfigError, InternalError, format_validation_error
from paraplan.units import UnitError
from paraplan.web import forms

#: Largest JSON body of a form (the model mapping is its longest field).
MAX_FORM_BYTES = 128 * 1024
PREDICT_FIELDS = (*tuple(f.name for f in forms.JOB_FLAGS), "model_yaml", "cluster_yaml", "interval")
HEADER = "x-paraplan"


class BadInput(Exception):
    """A 400 answer: the one-line message and the field it names."""

    def __init__(self, message: str, field: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.field, self.status = field, status


USER_ERRORS = (ConfigError, ValidationError, UnitError, InternalError, BadInput)


def message(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        return format_validation_error(exc)
    return " ".join(str(exc).split())


def error(exc: BaseException, fields: tuple[str, ...] = PREDICT_FIELDS, prefix: str = "") -> JSONResponse:
    text = message(exc)
    field = exc.field if isinstance(exc, BadInput) else forms.field_of(text, fields)
    status = exc.status if isinstance(exc, BadInput) else 500 if isinstance(exc, InternalError) else 400
    return JSONResponse({"error": text, "field": None if field is None else prefix + field}, status_code=status)


def json_answer(data: Any) -> Response:
    """``data`` as the CLI writes JSON (``report.formats.render_json``: a non-finite number is
    an internal error, never output)."""
    from paraplan.report.formats import render_json

    return Response(render_json(data), media_type="application/json")


async def read_body(request: Request, limit: int) -> bytes:
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


async def read_form(request: Request) -> dict[str, Any]:
    from paraplan.catalog.userdata import load_json

    body = await read_body(request, MAX_FORM_BYTES)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput("request: the form is not UTF-8 text") from None
    data = load_json(text or "{}", "the form")
    if not isinstance(data, dict):
        raise BadInput("request: the form is not a JSON object")
    return data


# -- the fields a form may type ----------------------------------------------------------------
def path_like(value: Any) -> bool:
    """A value the package would read as a file (a cluster file: a name ending in .yaml, .yml or
    .json); the page takes catalog names only and reads no file of the server's."""
    return isinstance(value, str) and value.strip().lower().endswith((".yaml", ".yml", ".json"))


def names_cluster(exc: BaseException) -> bool:
    return message(exc).startswith(("cluster", "unknown GPU"))


def mapping(text: Any, field: str, what: str) -> dict[str, Any]:
    """A model or cluster typed as YAML on the page, read as a job file is (the package's
    limits: no tags, aliases that cannot blow up, no repeated keys); a value naming a file
    (hf_config, a cluster file) is refused: the page reads no file of the server's."""
    from paraplan.catalog.userdata import load_yaml

    if not isinstance(text, str) or not text.strip():
        raise BadInput(f"{field}: give the {what}", field)
    if len(text) > forms.MAX_FIELD_CHARS:
        raise BadInput(f"{field}: longer than {forms.MAX_FIELD_CHARS:,} characters", field)
    read = load_yaml(text, field)
    if not isinstance(read, dict):
        raise BadInput(f"{field}: expected a mapping of {what}", field)
    if "hf_config" in read:
        raise BadInput(f"{field}: hf_config: upload the config.json instead", field)
    if any(path_like(value) for value in _strings(read)):
        raise BadInput(f"{field}: names a file; the page takes catalog names and values only", field)
    return read


def level(form: dict[str, Any]) -> float:
    """The form's interval level (``--interval``; 0.8 when the field is empty)."""
    from paraplan.uncertainty import check_level

    given = forms.typed("interval", form.get("interval"), float, "--interval")
    return check_level(0.8 if given is None else given)


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []
