"""Fit the learned backend's regressors on sample records (``paraplan fit``).

For every (GPU, operator, direction) and every (cluster, collective kind) in a samples file,
the sampled shapes become inventory operators (``op_for_sample``) or collectives, the
analytical cost model gives each a baseline, and a residual regressor learns
log(measured / baseline) from inventory features. Only single-operator and collective
samples are used: measured end-to-end runs never reach this module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from paraplan.catalog import load_cluster, load_gpu
from paraplan.costmodel import AnalyticalCostModel
from paraplan.costmodel.collectives import estimate_collective_s
from paraplan.costmodel.features import (
    COLLECTIVE_FEATURES,
    collective_features,
    collective_key,
    op_feature_names,
    op_features,
    op_key,
)
from paraplan.inventory import Collective, CollectiveKind, GroupLayout, ParallelDim
from paraplan.inventory.samples import op_for_sample, sample_shape
from paraplan.specs import ClusterSpec, GpuSpec, Phase, Precision

# Which sampled implementation an inventory operator is fitted on when the samples hold
# several: Megatron-LM and the GPUModeling25 runs use the fused scale-mask-softmax kernel.
PREFERRED_VARIANT = {"softmax": "ScaledUpperTriangMaskedSoftmax", "flash_atten": "flash_atten_causal"}
# Operators the inventory has no counterpart for (fillmask is fused into the softmax) or
# whose sampled setting differs from training (the optimizer files: fp16 without master
# weights, whole stage on one GPU) are not fitted; they stay analytical.
SKIPPED_NAMES = {"fillmask", "optimizer"}


@dataclass(frozen=True)
class Hardware:
    """GPUs and clusters the samples name that the catalog does not hold (``paraplan fit
    --cluster FILE``), by name; every other name is looked up in the catalog."""

    gpus: dict[str, Any] = field(default_factory=dict)
    clusters: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, clusters: Iterable[ClusterSpec]) -> Hardware:
        clusters = list(clusters)
        return cls({c.gpu.name: c.gpu for c in clusters}, {c.name: c for c in clusters})

    def gpu(self, name: str) -> GpuSpec:
        return self.gpus[name] if name in self.gpus else load_gpu(name)

    def cluster(self, name: str, num_nodes: int | None = None) -> ClusterSpec:
        if name in self.clusters:
            found = self.clusters[name]
            if num_nodes is None or num_nodes == found.num_nodes:
                return found
            return ClusterSpec.model_validate({**found.model_dump(), "num_nodes": num_nodes})
        return load_cluster(name) if num_nodes is None else load_cluster(name, num_nodes=num_nodes)


_CATALOG = Hardware()


@dataclass(frozen=True)
class FitTask:
    key: str
    X: Any
    baseline: Any
    measured: Any
    feature_names: list[str]
    groups: Any
    index: Any = None  # the samples table's index label of each row


def _op_tasks(samples, progress: Callable[[int], None], hardware: Hardware) -> list[FitTask]:
    import numpy as np

    tasks = []
    ops = samples[samples["kind"] == "op"]
    groups = ops.groupby(["device", "dtype", "name", "phase"], sort=True)
    for (device, dtype, name, phase), group in _reporting(groups, progress):
        if name in SKIPPED_NAMES:
            continue
        variants = set(group["variant"])
        wanted = PREFERRED_VARIANT.get(name)
        variant = wanted if wanted in variants else ("" if "" in variants else sorted(variants)[0])
        group = group[group["variant"] == variant]
        cluster = ClusterSpec(gpu=hardware.gpu(device), gpus_per_node=1)
        cm = AnalyticalCostModel(cluster, Precision(dtype), sustained=False)  # samples are burst timings
        rows, base, names = [], [], None
        for record in group.itertuples(index=False):
            row = sample_shape(record._asdict(), _missing)
            op = op_for_sample(variant or name, row, Precision(dtype))  # its traffic in the timed precision
            way_phases = (Phase.FWD,) if phase == "fwd" else (Phase.BWD_INPUT, Phase.BWD_WEIGHT)
            b = sum(cm.estimate_op_s(op, ph) for ph in way_phases)
            rows.append(op_features(op, phase, b))
            base.append(b)
            names = names or op_feature_names(op)
        X = np.asarray(rows, dtype=float)
        groups = [hash(tuple(r)) for r in X.round(9).tolist()]
        tasks.append(
            FitTask(
                op_key(device, dtype, name, phase), X, np.asarray(base), group["time_s"].to_numpy(), names, groups,
                group.index.to_numpy(),
            )
        )
    return tasks


def _reporting(groups, progress: Callable[[int], None]):
    """The groups of a groupby; ``progress(rows)`` once each group has been handled."""
    for key, group in groups:
        yield key, group
        progress(len(group))


def _missing(value) -> bool:
    import pandas as pd

    return bool(pd.isna(value))


def _collective_tasks(samples, progress: Callable[[int], None], hardware: Hardware) -> list[FitTask]:
    import numpy as np

    tasks = []
    colls = samples[samples["kind"] == "collective"]
    for (cluster_name, name), group in _reporting(colls.groupby(["cluster", "name"], sort=True), progress):
        kind = CollectiveKind(name)
        per_link: dict[str, tuple[list, list, list, list]] = {}
        clusters: dict[int, ClusterSpec] = {}
        for label, record in zip(group.index, group.itertuples(index=False), strict=True):
            nodes, per_node = int(record.nodes), int(record.gpus_per_node)
            if nodes not in clusters:
                clusters[nodes] = hardware.cluster(cluster_name, nodes)
            dim = ParallelDim.PP if kind is CollectiveKind.SEND_RECV else ParallelDim.DP
            coll = Collective(f"sample_{name}", kind, dim, float(record.bytes), Phase.FWD)
            layout = GroupLayout(size=nodes * per_node, nodes=nodes, per_node=per_node)
            b = estimate_collective_s(coll, layout, clusters[nodes])
            rows, base, measured, labels = per_link.setdefault(
                collective_key(cluster_name, name, layout), ([], [], [], [])
            )
            rows.append(collective_features(coll, layout, b))
            base.append(b)
            measured.append(record.time_s)
            labels.append(label)
        for key, (rows, base, measured, labels) in sorted(per_link.items()):
            tasks.append(
                FitTask(
                    key, np.asarray(rows, dtype=float), np.asarray(base), np.asarray(measured),
                    list(COLLECTIVE_FEATURES), None, np.asarray(labels),
                )
            )
    return tasks


def fit_tasks(
    samples, progress: Callable[[int], None] | None = None, hardware: Hardware = _CATALOG
) -> list[FitTask]:
    """The regression problems a samples table defines (one per regressor). ``progress(rows)``
    is called as each group of rows is turned into features; the rows add up to
    :func:`fitted_rows`. GPUs and clusters are the catalog's unless ``hardware`` has them."""

    def nothing(rows: int) -> None:
        pass

    return _op_tasks(samples, progress or nothing, hardware) + _collective_tasks(samples, progress or nothing, hardware)


def fittable(tasks: list[FitTask]) -> tuple[list[FitTask], dict[str, int]]:
    """The tasks with enough distinct shapes to fit and evaluate a regressor, and the distinct
    shapes of the others (their operators stay analytical): {key: distinct samples}."""
    from paraplan.regress.select import MIN_DISTINCT_SAMPLES

    keep, small = [], {}
    for task in tasks:
        distinct = len(set(task.groups)) if task.groups is not None else len({tuple(r) for r in task.X.tolist()})
        if distinct < MIN_DISTINCT_SAMPLES:
            small[task.key] = distinct
        else:
            keep.append(task)
    return keep, small


def fitted_rows(samples) -> int:
    """The rows of a samples table :func:`fit_tasks` reads (operators and collectives)."""
    return int(samples["kind"].isin(["op", "collective"]).sum())


def fit_models(
    tasks: list[FitTask],
    budget: str = "default",
    random_state: int = 0,
    progress: Callable[[str], None] | None = None,
    done: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Fit one residual regressor per task (see :func:`fit_tasks`); {key: FittedRegressor}."""
    from paraplan.regress.select import fit_best

    models = {}
    for task in tasks:
        if progress is not None:
            progress(task.key)
        models[task.key] = fit_best(
            task.key,
            task.X,
            task.baseline,
            task.measured,
            task.feature_names,
            budget=budget,
            random_state=random_state,
            groups=task.groups,
        )
        if done is not None:
            done()
    return models


def learning_curves_for(
    tasks: list[FitTask],
    models: dict[str, Any],
    random_state: int = 0,
    progress: Callable[[str], None] | None = None,
    done: Callable[[], None] | None = None,
) -> dict[str, list[tuple[float, int, float]]]:
    """Held-out error of each kept regressor trained on 10, 25, 50 and 100 % of its samples;
    ``progress(key)`` and ``done()`` around each, as in :func:`fit_models`."""
    from paraplan.regress.select import learning_curve

    curves = {}
    for task in tasks:
        if progress is not None:
            progress(task.key)
        model = models[task.key]
        curves[task.key] = learning_curve(
            task.X, task.baseline, task.measured, algorithm=model.algorithm, params=model.params,
            random_state=random_state, groups=task.groups, key=task.key,
        )
        if done is not None:
            done()
    return curves


# `paraplan fit` shows one progress bar over all its stages; it counts work in rough seconds on
# a 2-core machine, measured stage by stage on the A100 samples (102,419 rows, 37 regressors;
# 2026-11-25). Only the ratios matter: the bar's ETA divides the work left by the speed seen so
# far, so a machine twice as fast gets a true ETA too.
READ_WORK = 0.5  # reading the samples file
FEATURE_WORK_PER_ROW = 5.5e-5  # fit_tasks: inventory operator and analytical baseline per row
_FIT_WORK = {"default": (0.0, 0.052), "quick": (0.14, 0.010)}  # fit_best: a + b * sqrt(rows)
_CURVE_WORK = {"default": (0.08, 0.007), "quick": (0.01, 0.004)}  # learning_curve: a + b * sqrt(rows)
_SAVE_WORK = {"default": 0.09, "quick": 0.05}  # per regressor written
PLOT_WORK = 2.5  # importing matplotlib and drawing the learning curves


@dataclass(frozen=True)
class FitWork:
    """The work of the stages after the features, per regressor where it varies."""

    fit: dict[str, float]  # fit_models, per regressor key
    save: float
    curves: dict[str, float]  # learning_curves_for, per regressor key (empty: no curves)
    plot: float

    @property
    def total(self) -> float:
        return sum(self.fit.values()) + self.save + sum(self.curves.values()) + self.plot


def work_plan(sizes: dict[str, int], budget: str, curves: bool) -> FitWork:
    """Rough seconds each later stage of ``paraplan fit`` takes on regressors of these sizes
    (rows per key: :func:`regressor_sizes` before the features are built, the tasks' after)."""

    def law(table: dict[str, tuple[float, float]], rows: int) -> float:
        a, b = table.get(budget, table["default"])
        return a + b * rows**0.5

    return FitWork(
        fit={key: law(_FIT_WORK, rows) for key, rows in sizes.items()},
        save=_SAVE_WORK.get(budget, _SAVE_WORK["default"]) * len(sizes),
        curves={key: law(_CURVE_WORK, rows) for key, rows in sizes.items()} if curves else {},
        plot=PLOT_WORK if curves else 0.0,
    )


def task_sizes(tasks: list[FitTask]) -> dict[str, int]:
    return {t.key: len(t.measured) for t in tasks}


def regressor_sizes(samples) -> dict[str, int]:
    """The rows of each regressor :func:`fit_tasks` will define, counted from the table alone
    (in a blink, before the features are built)."""
    sizes: dict[str, int] = {}
    ops = samples[samples["kind"] == "op"]
    for (device, dtype, name, phase), group in ops.groupby(["device", "dtype", "name", "phase"], sort=True):
        if name in SKIPPED_NAMES:
            continue
        counts = group["variant"].value_counts()
        wanted = PREFERRED_VARIANT.get(name)
        variant = wanted if wanted in counts else ("" if "" in counts else sorted(counts.index)[0])
        sizes[op_key(device, dtype, name, phase)] = int(counts[variant])
    colls = samples[samples["kind"] == "collective"]
    for (cluster, name, inter), group in colls.groupby(["cluster", "name", colls["nodes"] > 1], sort=True):
        sizes[f"collective/{cluster}/{name}/{'inter' if inter else 'intra'}"] = len(group)
    return sizes


def training_metadata(samples_path, samples, budget: str, seed: int, hardware: Hardware = _CATALOG) -> dict[str, Any]:
    """What a models file records about how it was made."""
    from paraplan._version import __version__

    meta = dict(samples.attrs.get("samples_metadata", {}))
    return {
        "samples_file": str(samples_path),
        "samples_sources": meta.get("sources"),
        "samples_excluded": meta.get("excluded"),
        "devices": sorted(set(samples.loc[samples["kind"] == "op", "device"])),
        "clusters": sorted(set(samples.loc[samples["kind"] == "collective", "cluster"])),
        "budget": budget,
        "seed": seed,
        "paraplan_version": __version__,
        "target": "log(measured / analytical estimate)",
        "fingerprints": fingerprints(samples, hardware),
    }


def fingerprints(samples, hardware: Hardware = _CATALOG) -> dict[str, str]:
    """The baselines the residuals are relative to: each sampled GPU's catalog peaks and
    efficiency curves, each sampled cluster's links, as the catalog has them now."""
    from paraplan.costmodel.features import cluster_fingerprint, gpu_fingerprint

    out = {}
    for device in sorted(set(samples.loc[samples["kind"] == "op", "device"])):
        out[f"gpu/{device}"] = gpu_fingerprint(hardware.gpu(device))
    for name in sorted(set(samples.loc[samples["kind"] == "collective", "cluster"])):
        out[f"cluster/{name}"] = cluster_fingerprint(hardware.cluster(name))
    return out
