"""What a framework preset did to a job's plan: the defaults it filled in, the fields the user
stated differently (the user's value is used), and what it records that paraplan does not
model yet. The presets themselves are catalog data (``catalog/frameworks/*.yaml``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from paraplan.specs.enums import Framework


class PresetUse(BaseModel):
    """One preset applied to one plan (``catalog.presets.apply_preset``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    preset: str  # name-version, e.g. nemo-24.07
    label: str  # how output names it, e.g. "NVIDIA NeMo 24.07"
    engine: Framework  # the engine paraplan models it with
    # field -> value the preset set because the user did not state it
    taken: dict[str, Any] = {}
    # field -> (the user's value, which was used; the preset's)
    overridden: dict[str, tuple[Any, Any]] = {}
    # what the preset records that the plan has no field for yet (attention kernel; an FP8 recipe
    # a preset names no single default for)
    recorded: dict[str, str] = {}
    # the same for the model fields a preset sets (how its model code runs a kernel: an eager
    # RMSNorm, ``rmsnorm_fusion false``), kept apart from the plan's
    model_taken: dict[str, Any] = {}
    model_overridden: dict[str, tuple[Any, Any]] = {}

    def lines(self) -> list[str]:
        """The preset's part of a prediction, one line each (tables and notes)."""
        out = [f"framework {self.preset} ({self.label}; modelled as {self.engine.value})"]
        taken = {**self.taken, **self.model_taken}
        if taken:
            out.append("defaults taken from it: " + ", ".join(f"{k} {shown(v)}" for k, v in taken.items()))
        for key, (mine, theirs) in {**self.overridden, **self.model_overridden}.items():
            out.append(f"{key} {shown(mine)}: your value, used ({self.preset} would set {shown(theirs)})")
        if self.recorded:
            out.append("recorded, not yet modelled: " + ", ".join(f"{k} {v}" for k, v in self.recorded.items()))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "preset": self.preset,
            "engine": self.engine.value,
            "defaults_taken": {**self.taken, **self.model_taken},
            "user_values_used": {k: {"used": mine, "preset": theirs}
                                 for k, (mine, theirs) in {**self.overridden, **self.model_overridden}.items()},
            "recorded_not_modelled": dict(self.recorded),
        }


def shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
