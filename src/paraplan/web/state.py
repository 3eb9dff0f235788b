"""What the server holds between requests: recent predictions (their pictures and downloads
are asked for by key), uploaded configs in one temporary folder, and running searches (with
their progress and a way to cancel them)."""

from __future__ import annotations

import hashlib
import secrets
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paraplan.specs import ConfigError

#: Largest upload (a Hugging Face config.json is a few kB).
MAX_UPLOAD_BYTES = 1024 * 1024
#: Predictions kept for their pictures and downloads (the oldest is dropped first).
KEPT_PREDICTIONS = 256
#: Searches run at once; finished ones kept for browsing.
RUNNING_SEARCHES = 2
KEPT_SEARCHES = 16


class Predictions:
    """The last :data:`KEPT_PREDICTIONS` predictions by key (a random token)."""

    def __init__(self) -> None:
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, pred: Any) -> str:
        key = secrets.token_hex(8)
        with self._lock:
            self._items[key] = pred
            while len(self._items) > KEPT_PREDICTIONS:
                self._items.popitem(last=False)
        return key

    def get(self, key: str) -> Any:
        with self._lock:
            pred = self._items.get(key)
        if pred is None:
            raise ConfigError("prediction: no longer kept by the server; change a field to predict it again")
        return pred


class Uploads:
    """Uploaded files, each in its own folder under one temporary folder, named by the hash of
    its bytes; nothing is ever written elsewhere, nothing is executed."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="paraplan-web-"))

    def add(self, data: bytes, name: str) -> str:
        from paraplan.catalog.userdata import load_json

        if len(data) > MAX_UPLOAD_BYTES:
            raise ConfigError(f"hf_config: the upload is larger than {MAX_UPLOAD_BYTES // 1024} KiB")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(f"hf_config: {name} is not UTF-8 text") from None
        config = load_json(text, name)  # the package's limits for files: depth, repeated keys
        if not isinstance(config, dict):
            raise ConfigError(f"hf_config: {name} holds no JSON object (a Hugging Face config.json)")
        key = hashlib.sha256(data).hexdigest()[:20]
        folder = self.root / key
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_bytes(data)
        return key

    def path(self, key: Any) -> Path:
        if not isinstance(key, str) or not key.isalnum() or not (self.root / key / "config.json").is_file():
            raise ConfigError("hf_config: upload a Hugging Face config.json")
        return self.root / key / "config.json"

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class Cancelled(Exception):
    """A search the page cancelled."""


@dataclass
class SearchRun:
    """One search in a thread: its share done, its answer (the CLI's JSON) or its error."""

    request: Any
    top: int
    state: str = "running"  # running | done | error | cancelled
    done: float = 0.0  # share of the work done, 0-1
    started: float = field(default_factory=time.monotonic)
    elapsed_s: float = 0.0
    data: dict[str, Any] | None = None
    error: str | None = None
    plans: list[Any] = field(default_factory=list)  # the predictions of data["plans"], in order
    front: list[Any] = field(default_factory=list)
    pareto_png: bytes | None = None
    cancel: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        from paraplan.cli.search import search_data
        from paraplan.report.search import search_rows
        from paraplan.search.run import merge_results, search_plans

        searches = list(self.request.searches)
        try:
            results = []
            for i, kwargs in enumerate(searches):
                def progress(done: int, total: int, i: int = i) -> None:
                    if self.cancel.is_set():
                        raise Cancelled
                    self.done = (i + done / max(total, 1)) / len(searches)

                results.append(search_plans(**{**kwargs, "progress": progress}))
                self.done = (i + 1) / len(searches)
                if self.cancel.is_set():
                    raise Cancelled
            result = merge_results(results)
            front, axis = None, self.request.pareto_axis
            if result.ranked:
                from paraplan.report.pareto import pareto_plans

                front, to_train = pareto_plans(result, axis)
                self.front = list(front)
                self.pareto_png = _pareto_png(result, front, axis, to_train)
            rows = search_rows(result, self.top)
            self.plans = list(result.ranked[: len(rows)])
            self.data = search_data(result, rows, front, axis)
            self.state = "done"
        except Cancelled:
            self.state = "cancelled"
        except ConfigError as exc:
            self.error, self.state = str(exc), "error"
        except Exception as exc:  # a bug: said on the page in one line, not lost in a thread
            self.error, self.state = f"internal error: {type(exc).__name__}: {exc}", "error"
        finally:
            self.elapsed_s = time.monotonic() - self.started


_PLOT_LOCK = threading.Lock()  # matplotlib's pyplot is not thread-safe


def plot_lock() -> threading.Lock:
    return _PLOT_LOCK


def _pareto_png(result: Any, front: Any, axis: str, to_train: bool) -> bytes | None:
    from paraplan.report.pareto import plot_pareto

    with _PLOT_LOCK, tempfile.TemporaryDirectory(prefix="paraplan-web-") as folder:
        path = Path(folder) / "pareto.png"
        plot_pareto(result, front, path, axis=axis, to_train=to_train)
        return path.read_bytes()


class Searches:
    """Running and recent searches by key."""

    def __init__(self) -> None:
        self._runs: OrderedDict[str, SearchRun] = OrderedDict()
        self._lock = threading.Lock()

    def start(self, request: Any, top: int) -> str:
        with self._lock:
            running = sum(r.state == "running" for r in self._runs.values())
            if running >= RUNNING_SEARCHES:
                raise ConfigError(f"search: {running} searches are running; wait for one or cancel it")
            key = secrets.token_hex(8)
            run = SearchRun(request, top)
            self._runs[key] = run
            finished = [k for k, r in self._runs.items() if r.state != "running"]
            for old in finished[: max(0, len(self._runs) - KEPT_SEARCHES)]:
                del self._runs[old]
        threading.Thread(target=run.run, name=f"paraplan-search-{key}", daemon=True).start()
        return key

    def get(self, key: str) -> SearchRun:
        with self._lock:
            run = self._runs.get(key)
        if run is None:
            raise ConfigError("search: no longer kept by the server; run it again")
        return run

    def cancel_all(self) -> None:
        with self._lock:
            for run in self._runs.values():
                run.cancel.set()
