"""Which optional extra installs which module, and the one-line error when one is missing.

The core install (``pip install paraplan``) predicts, searches, exports, validates and reads
traces; the heavy parts are extras (pyproject.toml's ``[project.optional-dependencies]``). A
command that needs one and finds it missing ends with one line naming the extra, exit code 2.
"""

from __future__ import annotations

#: The extra that installs each optional top-level module (the first extra that has it).
EXTRA_OF_MODULE: dict[str, str] = {
    "matplotlib": "plot",
    "pandas": "learned",
    "pyarrow": "learned",
    "sklearn": "learned",
    "xgboost": "learned",
    "skops": "learned",
    "torch": "profile",
    "scipy": "calibrate",
    "ijson": "traces",
    "ray": "ray",
    "jax": "sharding",
    "jaxlib": "sharding",
    "deepspeed": "frameworks",
    "torchtitan": "frameworks",
    "mkdocs": "docs",
    "transformers": "hf",
    "starlette": "web",
    "jinja2": "web",
    "uvicorn": "web",
    "playwright": "webtest",
    "httpx": "webtest",
}


def missing_extra_message(exc: ImportError) -> str | None:
    """The one line for an import of an optional module that failed, or None when the module is
    not one an extra installs (then it is a bug, not a missing extra)."""
    name = (getattr(exc, "name", None) or "").split(".")[0]
    extra = EXTRA_OF_MODULE.get(name)
    if extra is None:
        return None
    return f"{name} is not installed: this needs the '{extra}' extra (pip install 'paraplan[{extra}]')"

