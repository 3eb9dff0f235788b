"""Save and load fitted regressors in safe formats: one model file per GPU (or cluster).

A model file (``a100.models``) is a single zip archive, read in memory and never extracted:

    manifest.json        format and versions, training metadata, and per key: the member file,
                         its sha256, algorithm, params, feature names, training ranges, errors
    models/000.ubj       an XGBoost model in XGBoost's own format: UBJSON (binary JSON, the
                         default; loads ~6x faster) or, with ``xgboost_format="json"``, JSON;
                         decoded and checked here before XGBoost parses it (XGBoost's parsers
                         and tree loader trust their input: deep nesting, a length past the end
                         or a node index out of range crash the process), and the booster XGBoost
                         built is dumped and checked again before it is used
    models/001.skops     a random forest in skops format, loaded with an explicit trusted-types
                         list (:data:`TRUSTED_SKOPS_TYPES`), then its trees' node indices are
                         bounds-checked (skops cannot: a crafted Tree could read out of bounds)

Nothing is ever unpickled. The manifest's sha256 only detects accidents (whoever crafts a file
recomputes it), so every model is validated as if hostile. Any problem (not a zip, a tampered
manifest, a checksum mismatch, a truncated model, an unexpected type in a skops file, a tree
whose indices point outside it) raises a one-line
:class:`paraplan.specs.ConfigError` that starts with the path. ``unzip -p a100.models
manifest.json`` shows what a file holds.

The strict decoders of XGBoost documents are in :mod:`paraplan.regress.ubjson`, the checks that
a model's trees can be walked safely in :mod:`paraplan.regress.trees`.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import zipfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from paraplan.catalog.userdata import json_depth
from paraplan.files.atomic import check_output_path, sweep_stale, temp_path
from paraplan.regress.estimators import ALGORITHMS, ResidualRegressor
from paraplan.regress.select import FittedRegressor
from paraplan.regress.trees import booster_problem, forest_problem, short_error
from paraplan.regress.ubjson import decode_ubjson, decode_xgboost_json
from paraplan.specs import ConfigError

__all__ = ["TRUSTED_SKOPS_TYPES", "load_models", "read_manifest", "save_models"]

FORMAT = "paraplan-models"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
XGBOOST_FORMATS = ("ubj", "json")
SUFFIXES = {"xgboost": (".ubj", ".json"), "rforest": (".skops",)}
# Types a random-forest skops file may hold beyond those skops trusts by default (scikit-learn
# estimators, numpy arrays and builtins). Anything else in a file is refused before loading.
TRUSTED_SKOPS_TYPES = frozenset({"sklearn.tree._tree.Tree"})
MAX_MEMBER_BYTES = 512 * 2**20  # refuse zip members that would expand beyond this
# A regressor corrects the analytical time by a factor exp(r) with r clipped to the training
# residual range. Fitted models stay within ~40x (the A100 all-gathers); a file claiming more than
# a thousandfold correction either way is tampered with or fitted on broken samples.
MAX_ABS_RESIDUAL = math.log(1000.0)
MAX_MANIFEST_DEPTH = 64  # nesting of manifest.json (the metadata is a few levels deep)
_MEMBER = re.compile(r"^models/\d{3,6}\.(ubj|json|skops)$")


def save_models(
    path: str | os.PathLike[str],
    models: dict[str, FittedRegressor],
    metadata: dict[str, Any],
    *,
    overwrite: bool = False,
    xgboost_format: str = "ubj",
) -> None:
    """Write ``models`` and the training ``metadata`` (JSON-serialisable) to one model file.

    An existing file is replaced only with ``overwrite=True`` (atomically: a reader never
    sees half a file). ``xgboost_format="json"`` stores XGBoost models as readable JSON.
    """
    if xgboost_format not in XGBOOST_FORMATS:
        raise ValueError(f"xgboost_format: {xgboost_format!r} is not one of {', '.join(XGBOOST_FORMATS)}")
    check_output_path(path, overwrite=overwrite)
    target = Path(path)

    entries: dict[str, Any] = {}
    members: dict[str, bytes] = {}
    for i, (key, fitted) in enumerate(models.items()):
        if not isinstance(key, str) or not key:
            raise ConfigError(f"{path}: model keys must be non-empty strings (got {key!r})")
        suffix = f".{xgboost_format}" if fitted.algorithm == "xgboost" else ".skops"
        member = f"models/{i:03d}{suffix}"
        members[member] = _estimator_bytes(fitted.estimator, xgboost_format)
        entries[key] = _entry(fitted, member, members[member])
    bad = lambda msg: ConfigError(f"{path}: cannot save: {msg}")  # noqa: E731
    for key, entry in entries.items():  # never write a file that load_models would refuse
        _check_entry(bad, key, json.loads(json.dumps(entry, default=_json_default)))

    import sklearn
    import skops
    import xgboost

    from paraplan._version import __version__

    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "paraplan_version": __version__,
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "libraries": {
            "numpy": np.__version__,
            "scikit-learn": sklearn.__version__,
            "xgboost": xgboost.__version__,
            "skops": skops.__version__,
        },
        "metadata": metadata,
        "models": entries,
    }
    text = json.dumps(manifest, indent=1, allow_nan=False, default=_json_default)
    if json_depth(json.loads(text)) > MAX_MANIFEST_DEPTH:
        raise ConfigError(f"{path}: cannot save: metadata is nested more than {MAX_MANIFEST_DEPTH} levels deep")

    sweep_stale(target)  # what an earlier writer killed mid-write left beside the target
    tmp = temp_path(target)
    try:
        with (
            open(tmp, "xb") as fh,
            zipfile.ZipFile(fh, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf,
        ):
            zf.writestr(MANIFEST, text)
            for member, data in members.items():
                zf.writestr(member, data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_models(path: str | os.PathLike[str]) -> tuple[dict[str, FittedRegressor], dict[str, Any]]:
    """The fitted regressors by key, and the training metadata given to :func:`save_models`."""
    with _open(path) as zf:
        manifest = _manifest(path, zf)
        models = {
            key: _fitted(path, key, entry, _member(path, zf, key, entry))
            for key, entry in manifest["models"].items()
        }
    return models, manifest["metadata"]


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The validated manifest (versions, metadata, per-key errors) without loading any model."""
    with _open(path) as zf:
        return _manifest(path, zf)


# --- writing -------------------------------------------------------------------------------


def _estimator_bytes(est: ResidualRegressor, xgboost_format: str) -> bytes:
    if est.algorithm == "xgboost":
        return bytes(est.estimator_.get_booster().save_raw(raw_format=xgboost_format))
    import skops.io as sio

    return sio.dumps(est.estimator_)


def _entry(fitted: FittedRegressor, member: str, data: bytes) -> dict[str, Any]:
    est = fitted.estimator
    return {
        "file": member,
        "sha256": hashlib.sha256(data).hexdigest(),
        "algorithm": fitted.algorithm,
        "params": fitted.params,
        "random_state": int(est.random_state),
        "feature_names": list(fitted.feature_names),
        "n_samples": int(fitted.n_samples),
        "cv_error": float(fitted.cv_error),
        "holdout_error": float(fitted.holdout_error),
        "baseline_holdout_error": float(fitted.baseline_holdout_error),
        "cv_errors": {k: float(v) for k, v in fitted.cv_errors.items()},
        "fit_seconds": float(fitted.fit_seconds),
        "x_min": [float(v) for v in fitted.x_min],
        "x_max": [float(v) for v in fitted.x_max],
        "residual_range": [float(est.residual_min_), float(est.residual_max_)],
    }


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(f"metadata: {type(obj).__name__} is not JSON-serialisable")


# --- reading -------------------------------------------------------------------------------


def _open(path: str | os.PathLike[str]) -> zipfile.ZipFile:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{path}: no such model file")
    try:
        return zipfile.ZipFile(p, "r")
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not a paraplan model file ({short_error(exc)})") from None


def _read(path: Any, zf: zipfile.ZipFile, name: str, what: str) -> bytes:
    try:
        info = zf.getinfo(name)
    except KeyError:
        raise ConfigError(f"{path}: {what} is missing from the archive") from None
    if info.file_size > MAX_MEMBER_BYTES:
        raise ConfigError(f"{path}: {what} is implausibly large ({info.file_size} bytes)")
    try:
        return zf.read(info)
    except Exception as exc:  # CRC errors, truncated archives, bad compression
        raise ConfigError(f"{path}: {what} cannot be read ({short_error(exc)})") from None


def _manifest(path: Any, zf: zipfile.ZipFile) -> dict[str, Any]:
    raw = _read(path, zf, MANIFEST, "manifest.json")
    try:
        manifest = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except RecursionError:
        raise ConfigError(f"{path}: manifest.json is nested too deeply") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{path}: manifest.json is not valid JSON ({short_error(exc)})") from None
    if json_depth(manifest) > MAX_MANIFEST_DEPTH:
        raise ConfigError(f"{path}: manifest.json is nested too deeply")
    bad = lambda msg: ConfigError(f"{path}: manifest.json: {msg}")  # noqa: E731
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise bad(f"not a {FORMAT} manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise bad(
            f"format_version {manifest.get('format_version')!r} is not supported "
            f"(this paraplan reads {FORMAT_VERSION})"
        )
    if not isinstance(manifest.get("metadata"), dict):
        raise bad("metadata must be a mapping")
    models = manifest.get("models")
    if not isinstance(models, dict):
        raise bad("models must be a mapping")
    files = set()
    for key, entry in models.items():
        _check_entry(bad, key, entry)
        if entry["file"] in files:
            raise bad(f"models.{key}: file {entry['file']!r} is used twice")
        files.add(entry["file"])
    return manifest


def _check_entry(bad: Any, key: str, entry: Any) -> None:
    """Types and consistency of one manifest entry; raises ``bad(msg)``."""
    where = f"models.{key}"
    if not key or not isinstance(entry, dict):
        raise bad(f"{where}: must be a mapping under a non-empty key")

    def need(field: str, kind: Any, what: str) -> Any:
        value = entry.get(field)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise bad(f"{where}.{field}: must be {what}")
        return value

    algorithm = need("algorithm", str, "a string")
    if algorithm not in ALGORITHMS:
        raise bad(f"{where}.algorithm: {algorithm!r} is not one of {', '.join(ALGORITHMS)}")
    member = need("file", str, "a string")
    if not _MEMBER.match(member) or not member.endswith(SUFFIXES[algorithm]):
        kinds = " or ".join(SUFFIXES[algorithm])
        raise bad(f"{where}.file: {member!r} is not a {kinds} member under models/")
    if not re.fullmatch(r"[0-9a-f]{64}", str(entry.get("sha256"))):
        raise bad(f"{where}.sha256: must be 64 hex digits")
    need("params", dict, "a mapping")
    need("random_state", int, "an integer")
    names = need("feature_names", list, "a list of strings")
    if not names or not all(isinstance(n, str) for n in names):
        raise bad(f"{where}.feature_names: must be a non-empty list of strings")
    if need("n_samples", int, "an integer") < 1:
        raise bad(f"{where}.n_samples: must be positive")
    for field in ("cv_error", "holdout_error", "baseline_holdout_error", "fit_seconds"):
        if not math.isfinite(need(field, (int, float), "a number")):
            raise bad(f"{where}.{field}: must be finite")
    cv_errors = need("cv_errors", dict, "a mapping")
    if not all(isinstance(v, (int, float)) for v in cv_errors.values()):
        raise bad(f"{where}.cv_errors: values must be numbers")
    for field, length in (("x_min", len(names)), ("x_max", len(names)), ("residual_range", 2)):
        values = need(field, list, "a list of numbers")
        if len(values) != length or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values
        ):
            raise bad(f"{where}.{field}: must be {length} finite numbers")
    low, high = entry["residual_range"]
    if low > high:
        raise bad(f"{where}.residual_range: lower bound above upper bound")
    if max(abs(low), abs(high)) > MAX_ABS_RESIDUAL:
        raise bad(
            f"{where}.residual_range: [{low:.4g}, {high:.4g}] would scale the analytical time by more "
            f"than 1000x (|log ratio| <= {MAX_ABS_RESIDUAL:.3f})"
        )
    kind = key.split("/", 1)[0]
    if kind == "op" and "log_flops" not in names:
        raise bad(f"{where}.feature_names: an op regressor's features include log_flops (got {', '.join(names)})")
    if kind == "collective" and ("log_bytes" not in names or "log_flops" in names):
        raise bad(
            f"{where}.feature_names: a collective regressor's features include log_bytes and not "
            f"log_flops (got {', '.join(names)})"
        )


def _member(path: Any, zf: zipfile.ZipFile, key: str, entry: dict[str, Any]) -> bytes:
    data = _read(path, zf, entry["file"], f"model file {key!r}")
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise ConfigError(f"{path}: model file {key!r} does not match its checksum (changed after saving)")
    return data


def _fitted(path: Any, key: str, entry: dict[str, Any], data: bytes) -> FittedRegressor:
    algorithm = entry["algorithm"]
    names = entry["feature_names"]
    if algorithm == "xgboost":
        inner = _load_xgboost(path, key, data, entry["file"].endswith(".json"), len(names))
    else:
        inner = _load_forest(path, key, data, len(names))
    if int(getattr(inner, "n_features_in_", -1)) != len(names):
        raise ConfigError(
            f"{path}: model file {key!r} expects {getattr(inner, 'n_features_in_', '?')} features, "
            f"the manifest names {len(names)}"
        )
    est = ResidualRegressor.from_fitted(
        algorithm, entry["params"], entry["random_state"], inner, len(names), tuple(entry["residual_range"])
    )
    return FittedRegressor(
        key=key,
        estimator=est,
        algorithm=algorithm,
        params=entry["params"],
        feature_names=list(names),
        n_samples=entry["n_samples"],
        cv_error=float(entry["cv_error"]),
        holdout_error=float(entry["holdout_error"]),
        baseline_holdout_error=float(entry["baseline_holdout_error"]),
        x_min=np.asarray(entry["x_min"], dtype=np.float64),
        x_max=np.asarray(entry["x_max"], dtype=np.float64),
        cv_errors={k: float(v) for k, v in entry["cv_errors"].items()},
        fit_seconds=float(entry["fit_seconds"]),
    )


def _load_xgboost(path: Any, key: str, data: bytes, is_json: bool, n_features: int) -> Any:
    kind = "JSON" if is_json else "UBJSON"
    bad = ConfigError(f"{path}: model file {key!r} is not a valid XGBoost {kind} model")
    head = data[:32]
    if not (head.startswith(b'{"learner"') if is_json else head.startswith(b"{L") and b"learner" in head):
        raise bad
    # XGBoost's parsers and tree loader trust their input (a deep nesting overflows the stack, a
    # UBJSON length past the end reads beyond the buffer, a parent index out of range is followed
    # while loading), so only a document decoded strictly here and checked reaches them.
    try:
        doc = decode_xgboost_json(data) if is_json else decode_ubjson(data)
    except (ValueError, IndexError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise bad from None
    _check_booster(path, key, doc, n_features)
    from xgboost import XGBRegressor

    model = XGBRegressor(n_jobs=1)
    try:
        model.load_model(bytearray(data))
        dump = bytes(model.get_booster().save_raw(raw_format="ubj"))
    except Exception:  # XGBoostError carries a multi-line C++ stack trace
        raise bad from None
    # What XGBoost built is what predict walks: check its own dump too. A UBJSON file XGBoost
    # wrote round-trips byte for byte, and then the dump is the document checked above.
    if dump != data:
        try:
            doc = decode_ubjson(dump)
        except (ValueError, IndexError):
            raise bad from None
        _check_booster(path, key, doc, n_features)
    return model


def _check_booster(path: Any, key: str, doc: Any, n_features: int) -> None:
    problem = booster_problem(doc, n_features)
    if problem:
        raise ConfigError(f"{path}: model file {key!r} is not a valid XGBoost model ({problem})")


def _load_forest(path: Any, key: str, data: bytes, n_features: int) -> Any:
    import skops.io as sio
    from sklearn.ensemble import RandomForestRegressor
    from skops.io.exceptions import UntrustedTypesFoundException

    if not zipfile.is_zipfile(io.BytesIO(data)):
        raise ConfigError(f"{path}: model file {key!r} is not a valid skops file")
    try:
        # skops refuses, before constructing anything, a file holding any type outside its
        # defaults (scikit-learn estimators, numpy, builtins) and this explicit list.
        model = sio.loads(data, trusted=sorted(TRUSTED_SKOPS_TYPES))
    except UntrustedTypesFoundException:
        found = sorted(set(sio.get_untrusted_types(data=data)) - TRUSTED_SKOPS_TYPES)
        raise ConfigError(
            f"{path}: model file {key!r} holds types paraplan does not trust: {', '.join(found[:5])}"
        ) from None
    except Exception:
        raise ConfigError(f"{path}: model file {key!r} is not a valid skops file") from None
    if type(model) is not RandomForestRegressor:
        raise ConfigError(f"{path}: model file {key!r} holds a {type(model).__name__}, not a random forest")
    problem = forest_problem(model, n_features)
    if problem:
        raise ConfigError(f"{path}: model file {key!r} is not a valid random forest ({problem})")
    model.set_params(n_jobs=1)
    return model


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")
