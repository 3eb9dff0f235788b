"""Writing user files safely: the check before a write (:func:`check_output_path`), temporary
files for atomic writes, and the sweep that removes those a killed writer left.

A file is replaced atomically by writing a hidden temporary file beside it and renaming it over
the target (a reader never sees half a file). A writer killed between the two (SIGKILL, power
loss) cannot remove its temporary file, so each is named after the process that writes it,
``.<target>.<pid>.<random>.tmp``, and the next write of the same target removes every such
file whose process is gone. Files a live process is writing are never touched.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from pathlib import Path

from paraplan.specs import ConfigError

# temporary files of earlier versions (tempfile.mkstemp's random names, no pid) older than this
# are stranded: no write of a model or samples file takes a day
LEGACY_AGE_S = 86400.0


def check_output_path(
    path: str | os.PathLike[str], *, overwrite: bool = False, flag: str = "overwrite=True", what: str = "model file"
) -> None:
    """Raise a one-line ConfigError unless a ``what`` can be written to ``path``: its folder
    exists, it is not a folder, and it does not exist unless ``overwrite`` (``flag`` names the
    option that allows replacing it, e.g. ``--force``). Nothing the user wrote is replaced
    silently."""
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"{path}: is a directory, not a {what}")
    if target.exists() and not overwrite:
        raise ConfigError(f"{path}: already exists (pass {flag} to replace it)")
    if not target.parent.is_dir():
        raise ConfigError(f"{path}: directory {str(target.parent)!r} does not exist")


def temp_path(target: Path) -> Path:
    """A fresh hidden temporary path beside ``target``, named after this process."""
    return target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def sweep_stale(target: Path) -> list[Path]:
    """Remove the temporary files of ``target`` that writers which no longer run left beside
    it; returns the paths removed. Another live writer's file stays."""
    folder = target.parent
    ours = re.compile(re.escape(f".{target.name}.") + r"(\d+)\.[0-9a-f]+\.tmp")
    legacy = re.compile(re.escape(f".{target.name}.") + r"(\d+|[a-z0-9_]{8})\.tmp")
    removed = []
    try:
        candidates = [p for p in folder.iterdir() if p.name.startswith(f".{target.name}.") and p.name.endswith(".tmp")]
    except OSError:
        return removed
    for path in candidates:
        mine, old = ours.fullmatch(path.name), legacy.fullmatch(path.name)
        pid = (mine or old).group(1) if (mine or old) else None
        if pid is None:
            continue
        if pid.isdigit():
            stale = not _alive(int(pid))
        else:
            stale = _age_s(path) > LEGACY_AGE_S
        if stale and path.is_file():
            try:
                path.unlink()
            except OSError:
                continue
            removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (when unsure: yes, keep its file)."""
    if pid == os.getpid():
        return True
    if os.name != "posix":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # someone else's process, or a pid the system cannot check
    return True


def _age_s(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0
