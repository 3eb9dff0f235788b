"""What the server holds between requests: recent predictions (their pictures and downloads
are asked for by key) and uploaded configs in one temporary folder (the searches are in
``searches``), and the lock every picture is drawn under."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from paraplan.specs import ConfigError

#: Largest upload (a Hugging Face config.json is a few kB).
MAX_UPLOAD_BYTES = 1024 * 1024
#: Predictions kept for their pictures and downloads (the oldest is dropped first).
KEPT_PREDICTIONS = 256

T = TypeVar("T")


class Keyed(Generic[T]):
    """Items by key behind a lock; asking for one no longer kept is the one-line error
    :attr:`GONE`."""

    GONE = ""

    def __init__(self) -> None:
        self._items: OrderedDict[str, T] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> T:
        with self._lock:
            item = self._items.get(key)
        if item is None:
            raise ConfigError(self.GONE)
        return item


@dataclass
class Kept:
    """A prediction the page may ask pictures and downloads of: its job (for intervals), its
    interval, and its pictures once drawn (by kind)."""

    job: Any
    pred: Any
    interval: Any
    pictures: dict[str, bytes] = field(default_factory=dict)


class Predictions(Keyed[Kept]):
    """The last :data:`KEPT_PREDICTIONS` predictions by key: the hash of their JSON (the CLI's,
    interval included), so the same plan predicted again has the same key and its pictures
    are not drawn again."""

    GONE = "prediction: no longer kept by the server; change a field to predict it again"

    def add(self, job: Any, pred: Any, interval: Any, data: dict[str, Any]) -> str:
        from paraplan.report.formats import render_json

        key = hashlib.sha256(render_json(data).encode()).hexdigest()[:20]
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
            else:
                self._items[key] = Kept(job, pred, interval)
            while len(self._items) > KEPT_PREDICTIONS:
                self._items.popitem(last=False)
        return key


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

    def job_file(self, cluster: dict[str, Any]) -> Path:
        """A job file of the demo job's model and batch on ``cluster`` (a cluster typed on the
        search page, already read with the package's limits), in the temporary folder, for
        ``SearchRequest.from_flags`` to read as a job file."""
        import yaml

        from paraplan.catalog.jobs import demo_job_mapping

        demo = demo_job_mapping()
        text = yaml.safe_dump({"model": demo["model"], "cluster": cluster,
                               "parallel": {"global_batch_size": demo["parallel"]["global_batch_size"]}},
                              sort_keys=False)
        folder = self.root / ("search-" + hashlib.sha256(text.encode()).hexdigest()[:20])
        folder.mkdir(exist_ok=True)
        (folder / "job.yaml").write_text(text, encoding="utf-8")
        return folder / "job.yaml"

    def path(self, key: Any) -> Path:
        if not isinstance(key, str) or not key.isalnum() or not (self.root / key / "config.json").is_file():
            raise ConfigError("hf_config: upload a Hugging Face config.json")
        return self.root / key / "config.json"

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


_PLOT_LOCK = threading.Lock()  # matplotlib's pyplot is not thread-safe


def plot_lock() -> threading.Lock:
    return _PLOT_LOCK
