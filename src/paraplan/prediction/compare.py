"""Two predictions side by side: each figure of A and of B, and B - A (absolute and relative).

The summary figures are the ones a user weighs a plan by (time, throughput, MFU, memory per
GPU and its margin, cost); the memory parts are the worst stage's, one per ``MEMORY_PARTS``;
the components are every field of the Breakdown, whatever fields it has.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from paraplan.prediction.memory_parts import MEMORY_PARTS
from paraplan.prediction.result import Prediction
from paraplan.specs import PLAN_ALIASES

# the summary's figures, in the order they are shown; each is a key of Prediction.to_dict()
# (``memory.total_bytes``: the worst stage's per GPU; ``memory.margin_bytes``: what it leaves
# of its GPU's memory after the headroom, negative when it does not fit)
SUMMARY_KEYS = (
    "iteration_s",
    "tokens_per_s",
    "mfu",
    "memory.total_bytes",
    "memory.hbm_bytes",
    "memory.margin_bytes",
    "cost.cost_per_hour_usd",
    "cost.usd_per_million_tokens",
    "cost.time_to_train_s",
    "cost.cost_to_train_usd",
)


@dataclass(frozen=True, slots=True)
class Delta:
    """One figure of A and of B (None where a prediction has none, e.g. cost without a price)."""

    key: str
    a: float | None
    b: float | None

    @property
    def change(self) -> float | None:
        """B - A."""
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def relative(self) -> float | None:
        """(B - A) / A; None where A is zero (a component one plan does not have) or negative (a
        margin A lacks: its ratio would turn the change's sign)."""
        change = self.change
        return None if change is None or not self.a or self.a < 0 else change / self.a

    def to_dict(self) -> dict[str, float | None]:
        return {"a": self.a, "b": self.b, "change": self.change, "relative": self.relative}


@dataclass(frozen=True)
class Comparison:
    """Predictions A and B, their summary figures and their breakdown components."""

    a: Prediction
    b: Prediction
    summary: tuple[Delta, ...]
    components: tuple[Delta, ...]  # one per Breakdown field, in its order, then the total
    settings: tuple[tuple[str, object, object], ...] = ()  # (key, A's, B's) of the settings that differ
    memory: tuple[Delta, ...] = ()  # the worst stage's memory parts, one per MEMORY_PARTS (key ``memory.<field>_bytes``)

    @property
    def fits(self) -> tuple[bool, bool]:
        return self.a.fits, self.b.fits

    def to_dict(self) -> dict:
        """The JSON form: both predictions whole, and the differences by key."""
        return {
            "a": self.a.to_dict(),
            "b": self.b.to_dict(),
            "settings_that_differ": {key: {"a": a, "b": b} for key, a, b in self.settings},
            "difference": {
                **{d.key: d.to_dict() for d in self.summary},
                "memory.fits": {"a": self.a.fits, "b": self.b.fits},
                **{d.key: d.to_dict() for d in self.memory},
                **{f"breakdown.{d.key}": d.to_dict() for d in self.components},
            },
        }


def _lookup(data: dict, key: str) -> float | None:
    value = _get(data, key)
    return None if value is None else float(value)  # type: ignore[arg-type]


def compare_predictions(a: Prediction, b: Prediction) -> Comparison:
    """A against B: every summary figure and breakdown component of both, B - A and its ratio to A."""
    da, db = a.to_dict(), b.to_dict()
    summary = tuple(Delta(key, _lookup(da, key), _lookup(db, key)) for key in SUMMARY_KEYS)
    components = tuple(Delta(f.name, getattr(a.breakdown, f.name), getattr(b.breakdown, f.name))
                       for f in fields(a.breakdown))
    total = Delta("total_s", a.breakdown.total_s, b.breakdown.total_s)
    memory = tuple(Delta(part.key, _lookup(da, part.key), _lookup(db, part.key)) for part in MEMORY_PARTS)
    return Comparison(a, b, summary, (*components, total), _settings(da, db) + _spec_settings(a, b, da, db), memory)


# the settings of a job, as keys of Prediction.to_dict() (``parallel``: every key of the plan)
_SETTINGS = ("model", "seq_length", "gpu", "cluster", "num_gpus", "precision", "backend")


def _settings(da: dict, db: dict) -> tuple[tuple[str, object, object], ...]:
    keys = [*_SETTINGS, *(f"parallel.{k}" for k in {**da["parallel"], **db["parallel"]})]
    pairs = ((key, _get(da, key), _get(db, key)) for key in keys)
    return tuple((key, a, b) for key, a, b in pairs if a != b)


def _spec_settings(a: Prediction, b: Prediction, da: dict, db: dict) -> tuple[tuple[str, object, object], ...]:
    """The model and plan fields the two jobs state differently that the JSON's settings do not
    show (``parallel.moe_host_sync``, ``parallel.tp_comm_overlap``, ``model.rmsnorm_fusion``,
    ...): every field of the specs, so no difference is ever called "nothing". Two different
    models differ in every field: their names say it, their fields are not listed."""
    shown = {*_SETTINGS, *(f"parallel.{k}" for k in {**da["parallel"], **db["parallel"]})}
    shown |= {f"parallel.{long}" for short, long in PLAN_ALIASES.items() if f"parallel.{short}" in shown}
    out = []
    for part in ("model", "parallel") if da["model"] == db["model"] else ("parallel",):
        sa, sb = (getattr(p.job, part).model_dump(mode="json") for p in (a, b))
        for key in sa.keys() | sb.keys():
            name = f"{part}.{key}"
            if name not in shown and key not in ("name", "seq_length") and sa.get(key) != sb.get(key):
                out.append((name, sa.get(key), sb.get(key)))
    return tuple(sorted(out))


def _get(data: dict, key: str) -> object:
    for part in key.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data
