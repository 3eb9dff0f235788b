"""Pareto chart: every plan the search scored, time against cost or memory, the front drawn.

The cloud is every plan that fits and meets the bounds, at the search's numbers (the screen's
for plans it did not predict exactly); the front is made of exact predictions.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from paraplan.prediction import Prediction
from paraplan.search import SearchResult, pareto_front
from paraplan.units import format_tokens

if TYPE_CHECKING:
    from paraplan.uncertainty import Interval

MAX_POINTS = 20_000  # per cluster configuration in the cloud; more are sampled (the front is always whole)


def _plan_key(p: Prediction) -> tuple:
    cluster = p.placement.cluster if p.placement is not None else p.job.cluster.name
    order = p.placement.node_order if p.placement is not None else ()
    return cluster, p.job.cluster.num_gpus, p.job.parallel.model_dump_json(), order


def pareto_plans(result: SearchResult, axis: str) -> tuple[list[Prediction], bool]:
    """The front of time against ``axis`` over every plan the search predicted exactly (the
    ranked shortlist and the plans the screen put near the front), sorted by time; and
    whether time is time to train (else time per token)."""
    plans = list({_plan_key(p): p for p in [*result.ranked, *result.front]}.values())
    if axis == "cost":
        plans = [p for p in plans if p.usd_per_million_tokens is not None]
    to_train = bool(plans) and all(p.time_to_train_s is not None for p in plans)
    x, y = _axes(axis, to_train)
    return pareto_front(plans, x, y), to_train


def _axes(axis: str, to_train: bool):
    if to_train:
        def x(p):
            return p.time_to_train_s
    else:
        def x(p):
            return 1.0 / p.tokens_per_s
    if axis == "memory":
        def y(p):
            return p.worst_memory.total
    elif to_train:
        def y(p):
            return p.cost_to_train_usd
    else:
        def y(p):
            return p.usd_per_million_tokens
    return x, y


def _runs(values: list) -> list[tuple]:
    out: list[list] = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return [(v, n) for v, n in out]


def _short(p: Prediction, with_gpus: bool) -> str:
    q = p.job.parallel
    text = f"tp{q.tp} pp{q.pp} dp{q.dp}" + (f" cp{q.cp}" if q.cp > 1 else "") + (f" vpp{q.vpp}" if q.vpp > 1 else "")
    text += f" mbs{q.micro_batch_size} Z{q.zero_stage} {q.recompute.value}"
    layers = [st.num_layers for st in p.stages]
    if len(set(layers)) > 1:
        text += ", layers " + ",".join(f"{n}x{v}" if n > 1 else str(v) for v, n in _runs(layers))
    if with_gpus:
        name = p.placement.cluster if p.placement is not None else p.job.cluster.name
        text = f"{hardware_label(name, p.job.cluster.num_gpus, p.job.cluster.num_nodes)}: {text}"
    return text


def hardware_label(cluster: str, num_gpus: int, num_nodes: int | None) -> str:
    """"8 x dgx-h100 (64 GPUs)": a catalog cluster is a node type, so the count before it is
    nodes; the GPUs follow in parentheses ("hetero-a100-a10 (32 GPUs)" without a node count)."""
    if num_nodes:
        return f"{num_nodes} x {cluster} ({num_gpus} GPUs)"
    return f"{cluster} ({num_gpus} GPUs)"


def plot_pareto(result: SearchResult, front: list[Prediction], path: Path, *, axis: str, to_train: bool,
                intervals: list[Interval] | None = None) -> Path:
    """Scatter of every scored plan (one colour per cluster configuration), the front on top,
    each front plan with its interval (``intervals``, one per plan) as error bars: on the time
    axis, and on the cost axis too (a plan's cost scales with its time)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.lines
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    train_tokens = next((p.job.train_tokens for p in front if p.job.train_tokens), None)
    several = len(result.configurations) > 1
    sizes = {c for c, _, _ in result.configurations}
    fig, ax = plt.subplots(figsize=(11, 5.5), layout="constrained")
    rng = np.random.default_rng(0)
    shown = total = 0
    x, y = _axes(axis, to_train)
    fx = [x(p) / 86400 if to_train else x(p) * 1e6 for p in front]
    fy = [y(p) / 2**30 if axis == "memory" else y(p) for p in front]
    all_x, all_y = [np.asarray(fx)], [np.asarray(fy)]
    try:
        for s in result.scored:
            t = s.seconds_per_token
            v = s.memory_bytes / 2**30 if axis == "memory" else s.usd_per_token
            if v is None or len(t) == 0:
                continue
            if to_train:
                xs, ys = t * train_tokens / 86400, (v if axis == "memory" else v * train_tokens)
            else:
                xs, ys = t * 1e6, (v if axis == "memory" else v * 1e6)
            idx = np.arange(len(xs))
            if len(idx) > MAX_POINTS:
                idx = np.sort(rng.choice(len(idx), MAX_POINTS, replace=False))
            shown, total = shown + len(idx), total + len(xs)
            all_x.append(xs[idx])
            all_y.append(ys[idx])
            label = s.cluster if len(sizes) == len(result.configurations) else hardware_label(
                s.cluster, s.num_gpus, s.num_nodes)
            ax.scatter(xs[idx], ys[idx], s=8, alpha=0.35, label=f"{label}: {len(xs):,} plans", rasterized=True)
        ax.plot(fx, fy, color="black", marker="o", markersize=5, linewidth=1.2, drawstyle="steps-post",
                label=f"Pareto front ({len(front)} plans)")
        if intervals:  # each front plan's interval: time (and cost, which scales with it) move together
            import matplotlib.collections

            lows, highs = np.exp([iv.low for iv in intervals]), np.exp([iv.high for iv in intervals])
            px, py = np.asarray(fx), np.asarray(fy)
            same = axis == "memory"
            segments = [[(x * lo, y if same else y * lo), (x * hi, y if same else y * hi)]
                        for x, y, lo, hi in zip(px, py, lows, highs, strict=True)]
            ax.add_collection(matplotlib.collections.LineCollection(
                segments, colors="black", linewidths=2.0, alpha=0.35,
                label=f"{intervals[0].label} interval (measured / predicted)"))
            all_x += [px * lows, px * highs]
        xa, ya = np.concatenate(all_x), np.concatenate(all_y)
        log_x = bool(len(xa)) and xa.max() / max(xa.min(), 1e-300) > 5
        if log_x:
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(_minor_label))
        if axis == "cost":
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(
                lambda v, _: f"${v:,.0f}" if to_train else f"${v:,.2f}"))
        numbers = [f"#{i + 1}" for i in range(len(front))]
        labelled = _labelled(fx, fy, log_x, numbers, (xa.min(), xa.max(), ya.min(), ya.max()))
        _front_ticks(ax, [fx[i] for i, _, _ in labelled], [fy[i] for i, _, _ in labelled], log_x, axis, to_train)
        for i, left, below in labelled:
            ax.annotate(numbers[i], (fx[i], fy[i]), fontsize=8, xytext=(-3 if left else 3, -3 if below else 3),
                        textcoords="offset points", ha="right" if left else "left", va="top" if below else "bottom")
        # what the numbered points are, beside the plot (the front's table has them all)
        handles, labels = ax.get_legend_handles_labels()
        blank = matplotlib.lines.Line2D([], [], linestyle="none")
        for i, _, _ in labelled:
            handles.append(blank)
            labels.append(f"#{i + 1} {_short(front[i], several)}")
        if len(labelled) < len(front):
            handles.append(blank)
            labels.append(f"(all {len(front)} in the front's table)")
        ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.07, 1.0), borderaxespad=0.0,
                  handletextpad=0.3)
        tokens = f" {tokens_text(train_tokens)} tokens" if to_train else ""
        ax.set_xlabel(f"days to train{tokens}" if to_train else "seconds per million tokens")
        if axis == "memory":
            ax.set_ylabel("GiB per GPU (worst pipeline stage)")
        else:
            ax.set_ylabel(f"dollars to train{tokens}" if to_train else "dollars per million tokens")
        ax.grid(True, which="both", alpha=0.3)
        what = "memory per GPU" if axis == "memory" else "cost"
        sampled = f", {shown:,} of {total:,} drawn" if shown < total else ""
        ax.set_title(f"Time against {what}: every plan that fits{sampled}; the front is exact")
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
    return Path(path)


def _front_ticks(ax, xs: list[float], ys: list[float], log_x: bool, axis: str, to_train: bool) -> None:
    """Ticks where the labelled front points sit, on the top and right edges (the best plans
    seldom fall on round numbers): their time above, their memory or cost on the right."""
    import matplotlib.ticker

    def spaced(values: list[float], log: bool, lo: float, hi: float) -> list[float]:
        out: list[float] = []  # at least 4 % of the axis apart, so that labels never overlap
        scale = (lambda v: np.log(v)) if log else (lambda v: v)
        span = max(scale(hi) - scale(lo), 1e-300)
        for v in sorted(set(values)):
            if all(abs(scale(v) - scale(u)) / span > 0.04 for u in out):
                out.append(v)
        return out

    top = ax.secondary_xaxis("top")
    top.set_xticks(spaced(xs, log_x, *ax.get_xlim()), minor=False)
    top.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    top.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:.3g}"))
    top.tick_params(labelsize=7, colors="0.3")
    right = ax.secondary_yaxis("right")
    right.set_yticks(spaced(ys, False, *ax.get_ylim()), minor=False)
    right.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    if axis == "cost":
        money = (lambda v, _: f"${v:,.0f}") if to_train else (lambda v, _: f"${v:,.3g}")
        right.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(money))
    else:
        right.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:.3g}"))
    right.tick_params(labelsize=7, colors="0.3")


def tokens_text(n: float) -> str:
    """A token count as people write it: 2T, 300B, 1.5M."""
    return format_tokens(n)


def _minor_label(v: float, _pos) -> str:
    """Minor ticks of a log axis: label 2 and 5 of each decade."""
    if v <= 0:
        return ""
    lead = v / 10 ** np.floor(np.log10(v))
    return f"{v:g}" if round(lead) in (2, 5) and abs(lead - round(lead)) < 1e-6 else ""


def _labelled(xs: list[float], ys: list[float], log_x: bool, texts: list[str],
              extent: tuple[float, float, float, float], most: int = 10) -> list[tuple[int, bool, bool]]:
    """Which front points get a label (numbered as the front's table rows), and whether it
    goes to the left of the point and below it: the first, the last, then the others, each
    where its box (estimated in fractions of the plot, whose data spans ``extent``: x and y
    min and max) stays inside and overlaps no label taken; at most ``most``."""
    if not xs:
        return []
    x0, x1, y0, y1 = extent
    if log_x:
        x, x0, x1 = np.log(np.asarray(xs)), np.log(x0), np.log(x1)
    else:
        x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    nx = (x - x0) / max(x1 - x0, 1e-300) * 0.9 + 0.05  # matplotlib's 5 % margins
    ny = (y - y0) / max(y1 - y0, 1e-300) * 0.9 + 0.05
    boxes: list[tuple[float, float, float, float]] = []
    chosen: list[tuple[int, bool, bool]] = []
    for i in [0, len(xs) - 1, *range(1, len(xs) - 1)]:
        if len(chosen) >= most:
            break
        width = 0.0085 * len(texts[i]) + 0.01
        prefer_left = bool(nx[i] > 0.6)
        for left, below in ((prefer_left, False), (prefer_left, True), (not prefer_left, False), (not prefer_left, True)):
            x_lo = nx[i] - width if left else nx[i]
            y_lo = ny[i] - 0.055 if below else ny[i]
            box = (x_lo, y_lo, x_lo + width, y_lo + 0.045)
            if box[0] < 0 or box[2] > 1 or box[1] < 0 or box[3] > 1:
                continue
            if all(box[2] < b[0] or b[2] < box[0] or box[3] < b[1] or b[3] < box[1] for b in boxes):
                boxes.append(box)
                chosen.append((i, left, below))
                break
    return sorted(chosen)
