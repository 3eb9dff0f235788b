"""The operator sampler: time every grid point's forward and backward, into a journal.

For each grid point (:mod:`paraplan.profile.grid`) and dtype, the inventory gives the
operator (:func:`paraplan.inventory.samples.op_for_sample`), :mod:`paraplan.profile.kernels`
allocates its tensors and :mod:`paraplan.profile.timing` times the forward and the backward.
The two rows (schema rows, :mod:`paraplan.samples.schema`, ``device`` = the catalog GPU name
the user files them under) are appended to the journal as one point
(:class:`paraplan.profile.records.RecordStore`) before the next point starts. A point that
cannot run (a shape the inventory refuses, a dtype the device lacks, out of memory) is
recorded as skipped with the reason. Points already in the journal are not measured again.
"""

from __future__ import annotations

import contextlib
import hashlib
import platform
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from paraplan.profile.grid import GridPoint
from paraplan.profile.kernels import Unsupported, build_kernel
from paraplan.profile.records import RecordStore
from paraplan.profile.timing import TimingPolicy, measure
from paraplan.specs import ConfigError, Precision

__all__ = [
    "CPU_DEVICE_NAME",
    "SweepResult",
    "SweepSettings",
    "default_device_name",
    "device_info",
    "pending",
    "run_sweep",
    "sweep_header",
]

#: What CPU rows are filed under unless ``--device-name`` says otherwise: the one-core "GPU"
#: of examples/tiny-cpu/cluster.yaml.
CPU_DEVICE_NAME = "cpu-core"
_DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")
#: The GPT-2-style vocabulary columns: their rows record the rank's vocabulary rows (``vp``).
_VOCAB_DIM = {"linear_final": "n", "embedding": "vocab", "cross_entropy": "vocab"}


@dataclass(frozen=True)
class SweepSettings:
    device: str = "cpu"  # "cpu", "cuda", "cuda:1"
    device_name: str = CPU_DEVICE_NAME  # the catalog GPU the rows are filed under
    dtypes: tuple[str, ...] = ("fp32",)
    threads: int | None = 1  # CPU threads (None: torch's default); one core = cpu-core
    policy: TimingPolicy = field(default_factory=TimingPolicy)

    def __post_init__(self) -> None:
        if not (self.device == "cpu" or self.device == "cuda" or self.device.startswith("cuda:")):
            raise ConfigError(f"--device: {self.device!r} is not cpu, cuda or cuda:N")
        bad = [d for d in self.dtypes if d not in _DTYPES]
        if bad or not self.dtypes:
            raise ConfigError(f"--dtype: {bad[0] if bad else 'none'!r} is not one of {', '.join(_DTYPES)}")
        if not self.device_name.strip():
            raise ConfigError("--device-name: empty")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"--threads: {self.threads} is not a positive integer")


@dataclass
class SweepResult:
    measured: int = 0  # points measured by this run
    skipped: int = 0  # points this run recorded as skipped
    resumed: int = 0  # points found in the journal (an earlier run's)
    wall_s: float = 0.0


def default_device_name(device: str) -> str:
    """torch's name of a CUDA device; :data:`CPU_DEVICE_NAME` for the CPU."""
    if device == "cpu":
        return CPU_DEVICE_NAME
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: torch {torch.__version__} sees no CUDA device")
    return torch.cuda.get_device_name(torch.device(device))


def device_info(device: str) -> dict[str, str]:
    """What a sample's time depends on besides its shape: the device, driver and libraries."""
    import torch

    info = {"torch": torch.__version__, "cuda": torch.version.cuda or "", "python": platform.python_version(),
            "host": platform.machine(), "device": device}
    if device == "cpu":
        info["device_model"] = _cpu_model()
        info["driver"] = ""
        return info
    if not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: torch {torch.__version__} sees no CUDA device")
    dev = torch.device(device)
    props = torch.cuda.get_device_properties(dev)
    info["device_model"] = torch.cuda.get_device_name(dev)
    info["compute_capability"] = f"{props.major}.{props.minor}"
    info["cudnn"] = str(torch.backends.cudnn.version() or "")
    info["driver"] = _nvidia_driver()
    return info


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _nvidia_driver() -> str:
    import subprocess

    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10, check=False)
        return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else ""
    return ""


def sweep_header(points: Sequence[GridPoint], settings: SweepSettings, info: dict[str, str],
                 parts: tuple[int, int] = (1, 1)) -> dict[str, Any]:
    """What identifies a sweep in its journal: the same command gives the same header."""
    keys = [p.key(d) for p in points for d in settings.dtypes]
    digest = hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]
    return {"sampler": "ops", "device_name": settings.device_name, "dtypes": list(settings.dtypes),
            "threads": settings.threads, "points": len(keys), "grid_sha256": digest, "parts": list(parts),
            "device_info": info, "policy": asdict(settings.policy)}


def _work(points: Sequence[GridPoint], dtypes: Sequence[str]) -> Iterator[tuple[GridPoint, str]]:
    for point in points:
        for dtype in dtypes:
            yield point, dtype


def pending(points: Sequence[GridPoint], settings: SweepSettings, store: RecordStore) -> int:
    """Points (x dtypes) the journal does not hold yet."""
    done = store.done_keys()
    return sum(1 for p, d in _work(points, settings.dtypes) if p.key(d) not in done)


def _row(point: GridPoint, op: Any, dtype: str, phase: str, time_s: float, device_name: str) -> dict[str, Any]:
    values = point.values()
    row: dict[str, Any] = {"kind": "op", "name": point.name, "variant": point.variant, "phase": phase,
                           **{c: values.get(c) for c in ("mp", "b", "h", "l", "dim")},
                           "vp": values.get("Vp"), "encoders": None, "bytes": None, "nodes": None,
                           "gpus_per_node": None, "dtype": dtype, "device": device_name, "cluster": "",
                           "time_s": time_s}
    if point.name in _VOCAB_DIM and row["vp"] is None:
        row["vp"] = dict(op.dims)[_VOCAB_DIM[point.name]]  # the rank's vocabulary rows the op used
    return row


def _memory_limit(device: str) -> float:
    """Bytes a point may allocate: half the memory available (CPU), 90 % of the free (CUDA)."""
    if device == "cpu":
        with contextlib.suppress(OSError, ValueError):
            with open("/proc/meminfo", encoding="utf-8") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return 0.5 * int(line.split()[1]) * 1024
        return float("inf")
    import torch

    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return 0.9 * free


def _is_oom(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "out of memory" in text or "can't allocate memory" in text or "cannot allocate memory" in text


def measure_point(point: GridPoint, dtype: str, settings: SweepSettings
                  ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The forward and backward rows of one point, and their timing details; raises
    :class:`Unsupported` with the reason when the point cannot run here."""
    from paraplan.inventory.samples import op_for_sample

    if dtype == "fp8":
        if settings.device == "cpu":
            raise Unsupported("fp8: the CPU has no FP8 matrix units (a GPU of compute capability 8.9+ has)")
        raise Unsupported("fp8: the sampler has no FP8 kernels yet (Transformer Engine's are not timed)")
    if dtype == "tf32":
        if settings.device == "cpu":
            raise Unsupported("tf32: the CPU has no TF32 matrix units (an NVIDIA GPU of compute capability 8.0+ has)")
        raise Unsupported("tf32: the sampler times no TF32 kernels yet (fp32 with torch.backends.cuda.matmul.allow_tf32)")
    try:
        op = op_for_sample(point.tag, point.values(), Precision(dtype))
    except (ValueError, LookupError) as exc:
        raise Unsupported(f"unsupported shape: {exc}") from None
    need = op.bytes + op.bwd_bytes
    limit = _memory_limit(settings.device)
    if need > limit:
        raise Unsupported(f"out of memory: needs about {need / 2**30:.1f} GiB, {limit / 2**30:.1f} GiB free")
    import torch

    torch.manual_seed(0)
    try:
        kernel = build_kernel(point.name, op, point.values(), dtype=dtype, device=settings.device)
        fwd = measure(kernel.forward, settings.device, settings.policy)
        bwd = measure(kernel.backward, settings.device, settings.policy)
    except Unsupported:
        raise
    except (RuntimeError, MemoryError) as exc:
        if settings.device != "cpu":
            torch.cuda.empty_cache()
        if isinstance(exc, MemoryError) or _is_oom(exc):
            raise Unsupported("out of memory") from None
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise Unsupported(f"{dtype} {point.name} does not run on {settings.device}: {first}") from None
    rows = [_row(point, op, dtype, "fwd", fwd.median_s, settings.device_name),
            _row(point, op, dtype, "bwd", bwd.median_s, settings.device_name)]
    extra = {phase: {"spread": round(t.spread, 5), "repeats": t.repeats, "inner": t.inner, "converged": t.converged}
             for phase, t in (("fwd", fwd), ("bwd", bwd))}
    return rows, extra


@contextlib.contextmanager
def _threads(settings: SweepSettings) -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    if settings.device == "cpu" and settings.threads is not None:
        torch.set_num_threads(settings.threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_sweep(
    points: Sequence[GridPoint],
    settings: SweepSettings,
    store: RecordStore,
    progress: Callable[[str, str], None] | None = None,
) -> SweepResult:
    """Measure every (point, dtype) the journal does not hold; ``progress(key, outcome)`` after
    each (outcome ``"measured"`` or ``"skipped: <reason>"``)."""
    import time

    result = SweepResult()
    start = time.perf_counter()
    done = store.done_keys()
    with _threads(settings):
        for point, dtype in _work(points, settings.dtypes):
            key = point.key(dtype)
            if key in done:
                result.resumed += 1
                continue
            try:
                rows, extra = measure_point(point, dtype, settings)
            except Unsupported as exc:
                store.skip(key, str(exc))
                result.skipped += 1
                outcome = f"skipped: {exc}"
            else:
                store.append(rows, key=key, extra=extra)
                result.measured += 1
                outcome = "measured"
            if progress is not None:
                progress(key, outcome)
    result.wall_s = time.perf_counter() - start
    return result


def spread_summary(store: RecordStore) -> dict[str, Any]:
    """Median and largest spread (IQR / median) of the journal's timings, and how many did not
    reach the target spread within their budget."""
    import statistics

    spreads, unconverged = [], 0
    for entry in store.entries():
        for timing in (entry.get("extra") or {}).values():
            if isinstance(timing, dict) and "spread" in timing:
                spreads.append(float(timing["spread"]))
                unconverged += not timing.get("converged", True)
    if not spreads:
        return {"timings": 0}
    finite = [s for s in spreads if s != float("inf")]
    return {"timings": len(spreads), "median_spread": statistics.median(finite) if finite else None,
            "max_spread": max(finite) if finite else None, "unconverged": unconverged}


def metadata(store: RecordStore, settings: SweepSettings, info: dict[str, str], parts: tuple[int, int],
             grid: str) -> dict[str, Any]:
    """The samples file's metadata: where, on what and how the rows were measured."""
    return {"importer": "paraplan profile ops", "sources": [store.path.name], "device_info": info,
            "device_name": settings.device_name, "dtypes": list(settings.dtypes), "threads": settings.threads,
            "timing": asdict(settings.policy) | {"clock": "cuda events" if settings.device != "cpu"
                                                  else "time.perf_counter"},
            "spread": spread_summary(store), "parts": list(parts), "grid": grid}
