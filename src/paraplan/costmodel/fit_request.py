"""A fit asked for in words: the flags of ``paraplan fit`` (samples files, a models file, cluster
files for hardware the catalog lacks, the budget, learning curves) checked and turned into the
fit to run.

``FitRequest.from_flags(...)`` checks every flag and output path (a bad one raises a
``ConfigError`` naming it) before minutes of fitting; ``request.run(read_samples, progress)``
reads the samples, fits the regressors, saves the models file and returns what it fitted. It
never prints: the kept-analytical regressors and the stages reach the caller by callbacks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import paraplan.costmodel.fitting as fitting
from paraplan.specs import ConfigError


class Progress(Protocol):
    """What :meth:`FitRequest.run` tells about its stages, its work in rough seconds
    (``costmodel.fitting``): the CLI's ``StagedProgress`` is one."""

    def add_work(self, work: float) -> None: ...
    def stage(self, description: str) -> None: ...
    def advance(self, work: float) -> None: ...


class _Silent:
    def add_work(self, work: float) -> None:
        pass

    def stage(self, description: str) -> None:
        pass

    def advance(self, work: float) -> None:
        pass


@dataclass(frozen=True)
class FitResult:
    """The regressors fitted and saved ({key: FittedRegressor}), their learning curves when
    asked for, and the regressors kept analytical ({key: distinct samples})."""

    models: dict[str, Any]
    curves: dict[str, list[tuple[float, int, float]]] | None
    kept_analytical: dict[str, int]


@dataclass(frozen=True)
class FitRequest:
    """One ``paraplan fit``: what it reads, fits and writes."""

    samples_files: tuple[Path, ...]
    out_file: Path
    hardware: fitting.Hardware
    budget: str = "default"
    overwrite: bool = False
    learning_curves: Path | None = None  # a .png, .svg or .pdf to draw the curves to
    seed: int = 0

    @property
    def samples_name(self) -> str:
        """The samples files as messages and the models file's metadata name them."""
        return ", ".join(map(str, self.samples_files))

    @classmethod
    def from_flags(
        cls,
        samples_files: Iterable[Path],
        *,
        out_file: Path,
        cluster_files: Iterable[Path] | None = None,
        quick: bool = False,
        force: bool = False,
        learning_curves: Path | None = None,
        seed: int = 0,
    ) -> FitRequest:
        """The request of ``paraplan fit``'s flags: the cluster files read (their GPUs and
        clusters serve samples that name hardware the catalog lacks) and every output path
        checked, so a bad one is refused before minutes of fitting, not after."""
        from paraplan.catalog.jobs import load_cluster_file
        from paraplan.files.atomic import check_output_path
        from paraplan.files.pictures import check_plot_path

        hardware = fitting.Hardware.of(load_cluster_file(p) for p in cluster_files or [])
        check_output_path(out_file, overwrite=force, flag="--force")
        if learning_curves is not None:
            check_plot_path(learning_curves, overwrite=force, flag="--force")
            if learning_curves.resolve() == out_file.resolve():
                raise ConfigError(f"{learning_curves}: --learning-curves and --out name the same file")
        return cls(tuple(samples_files), out_file, hardware, "quick" if quick else "default", force,
                   learning_curves, seed)

    def run(
        self,
        read_samples: Callable[[Sequence[Path]], Any],
        progress: Progress | None = None,
        kept_analytical: Callable[[str, int], None] | None = None,
    ) -> FitResult:
        """Read the samples (``read_samples``: ``samples.merge.load_many``, a layer above this
        one), fit one regressor per (GPU, operator, direction) and (cluster, collective), save
        them and compute the learning curves if asked for. ``progress`` hears each stage and its
        work, the whole run's foretold from the samples table so its ETA holds from the first
        stage; drawing the curves (``fitting.PLOT_WORK``) is the caller's last stage.
        ``kept_analytical(key, distinct)`` hears of each regressor with too few distinct
        samples, before the fitting starts."""
        from paraplan.regress.select import MIN_DISTINCT_SAMPLES
        from paraplan.regress.store import save_models

        bar = progress or _Silent()
        curves_too = self.learning_curves is not None
        bar.add_work(fitting.READ_WORK)
        samples = read_samples(self.samples_files)
        bar.advance(fitting.READ_WORK)
        n_rows = fitting.fitted_rows(samples)
        planned = fitting.work_plan(fitting.regressor_sizes(samples), self.budget, curves=curves_too)
        bar.add_work(n_rows * fitting.FEATURE_WORK_PER_ROW + planned.total)
        bar.stage(f"features of {n_rows:,} samples")
        tasks = fitting.fit_tasks(samples, progress=lambda n: bar.advance(n * fitting.FEATURE_WORK_PER_ROW),
                                  hardware=self.hardware)
        tasks, too_few = fitting.fittable(tasks)
        for key, distinct in too_few.items() if kept_analytical is not None else ():
            kept_analytical(key, distinct)
        if not tasks:
            raise ConfigError(f"{self.samples_name}: no operator or collective samples to fit"
                              + (f" (every regressor has fewer than {MIN_DISTINCT_SAMPLES} distinct samples)"
                                 if too_few else ""))
        work = fitting.work_plan(fitting.task_sizes(tasks), self.budget, curves=curves_too)
        bar.add_work(work.total - planned.total)
        order = {t.key: i for i, t in enumerate(tasks, 1)}
        current: list[str] = []

        def starting(what: str) -> Callable[[str], None]:
            def start(key: str) -> None:
                current[:] = [key]
                bar.stage(f"{what} {order[key]}/{len(tasks)}: {_short(key)}")

            return start

        models = fitting.fit_models(tasks, budget=self.budget, random_state=self.seed, progress=starting("fitting"),
                                    done=lambda: bar.advance(work.fit[current[0]]))
        bar.stage("saving the models")
        metadata = fitting.training_metadata(self.samples_name, samples, self.budget, self.seed, self.hardware)
        save_models(self.out_file, models, metadata, overwrite=self.overwrite)
        bar.advance(work.save)
        curves = None
        if curves_too:
            curves = fitting.learning_curves_for(tasks, models, random_state=self.seed, progress=starting("curves"),
                                                 done=lambda: bar.advance(work.curves[current[0]]))
        return FitResult(models, curves, too_few)


def _short(key: str) -> str:
    """A regressor's key without its GPU or cluster: ``linear1/fwd``, ``all_reduce/inter``."""
    return "/".join(key.split("/")[-2:])
