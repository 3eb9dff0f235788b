"""Pareto chart: every feasible plan's time against its cost, the front highlighted."""

from __future__ import annotations

from pathlib import Path

from paraplan.prediction import Prediction


def _cluster(p: Prediction) -> str:
    return p.placement.cluster if p.placement is not None else p.job.cluster.name


def _label(p: Prediction) -> str:
    q = p.job.parallel
    gpus = p.gpu_name if p.placement is not None else f"{p.job.cluster.num_gpus}x{p.gpu_name}"
    return f"{gpus} tp{q.tp} pp{q.pp} dp{q.dp}"


def plot_pareto(plans: list[Prediction], front: list[Prediction], path: Path, *, to_train: bool) -> Path:
    """Scatter of time (to train, or per iteration) against dollars, front connected."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def xy(p: Prediction) -> tuple[float, float]:
        if to_train:
            return p.time_to_train_s / 86400, p.cost_to_train_usd
        return 1e6 / p.tokens_per_s, p.usd_per_million_tokens

    fig, ax = plt.subplots(figsize=(8, 5), layout="constrained")
    try:
        gpus = sorted({_cluster(p) for p in plans})
        for name in gpus:
            pts = [xy(p) for p in plans if _cluster(p) == name]
            ax.scatter([x for x, _ in pts], [y for _, y in pts], s=10, alpha=0.4, label=name)
        fx = [xy(p) for p in front]
        ax.plot([x for x, _ in fx], [y for _, y in fx], color="black", marker="o", linewidth=1.2, label="Pareto front")
        for p, (x, y) in zip(front[:8], fx[:8], strict=False):
            ax.annotate(_label(p), (x, y), fontsize=7, xytext=(4, 4), textcoords="offset points")
        ax.set_xlabel("days to train" if to_train else "seconds per million tokens")
        ax.set_ylabel("dollars to train" if to_train else "dollars per million tokens")
        ax.set_xscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title("Time against cost of every feasible plan")
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
    return Path(path)
