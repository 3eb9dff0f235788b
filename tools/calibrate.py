#!/usr/bin/env python3
"""Calibrate the analytical cost model (the fits live in ``paraplan.calibrate``).

``operators DIR --gpu NAME`` fits a GPU's ``EfficiencySpec``; ``links DIR --cluster NAME`` fits
a cluster's link parameters (docs/calibration.md). Run from the repository root with
``PYTHONPATH=src``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from paraplan.calibrate import (
    DEFAULT_MEMORY_TAGS,
    OP_CURVE_MODES,
    SOFTMAX_TAGS,
    EfficiencyFit,
    ErrorRow,
    LinkOptions,
    OperatorOptions,
    calibrate_links,
    calibrate_operators,
    catalog_file,
    replace_efficiency_block,
)
from paraplan.calibrate._common import rel_path
from paraplan.catalog import load_gpu

US = 1e-6


def _table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    """A plain fixed-width text table (also valid Markdown)."""
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def fmt(r: list[str]) -> str:
        return (
            "| "
            + " | ".join(
                c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
            + " |"
        )

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([fmt(cells[0]), sep, *(fmt(r) for r in cells[1:])])


def _err_cells(rows: Sequence[ErrorRow]) -> list[list[object]]:
    out = []
    for r in rows:
        cells: list[object] = [r.operator, r.phase, r.samples]
        for e in r.errors:
            cells += [f"{e.median_abs:.1f}", f"{e.mean_abs:.1f}", f"{e.median:+.1f}"]
        out.append(cells)
    return out


def _err_header(labels: Sequence[str] | None) -> tuple[str, ...]:
    if labels is None:
        return ("operator", "phase", "samples", "median |err| %", "mean |err| %", "median err %")
    out = ["operator", "phase", "samples"]
    for label in labels:
        out += [f"{label}: median |err| %", "mean |err| %", "median err %"]
    return tuple(out)


def _fmt_fit(fit: EfficiencyFit) -> str:
    spec = fit.spec
    lines = []
    for c in fit.curves[:3]:
        lines.append(f"  {c.name}: max_fraction={c.max_fraction:.4f} half_work={c.half_work:.4g} (fixed {c.fixed_us:.2f} us)")
    lines.append(f"  kernel_overhead_s={spec.kernel_overhead_s:.3g} ({spec.kernel_overhead_s / US:.2f} us)")
    if spec.ops:
        rows = [[c.name, c.work, f"{c.max_fraction:.4f}", f"{c.half_work:.4g}", f"{c.fixed_us:.2f}"] for c in fit.curves[3:]]
        lines.append("  ops:")
        lines.append(_table(rows, ("curve", "work", "max_fraction", "half_work", "fixed us")))
    return "\n".join(lines)


def cmd_operators(args: argparse.Namespace) -> int:
    folder = Path(args.dir)
    gpu = load_gpu(args.gpu)
    opts = OperatorOptions(
        op_curves=args.op_curves, min_samples=args.min_samples, compare=args.compare,
        softmax_curve=args.softmax_curve, kernel_overhead_us=args.kernel_overhead_us,
        precision=args.precision, max_nfev=args.max_nfev, seed=args.seed, holdout=args.holdout,
        loss=args.loss, date=args.date,
    )
    peak = gpu.flops_for(opts.precision)
    print(f"# operators: {rel_path(folder)} on {gpu.name}")
    print(
        f"# peak {opts.precision} {peak / 1e12:.1f} TFLOP/s, HBM {gpu.hbm_bandwidth_bytes_per_s / 1e9:.0f} GB/s "
        f"(catalog); seed {args.seed}, hold-out {args.holdout:.0%}, loss {args.loss}"
    )
    print(
        f"# per-operator curves: {opts.op_curves} (operator and direction with >= {args.min_samples} samples); "
        f"kind-level memory curve fitted on {', '.join(DEFAULT_MEMORY_TAGS)}; softmax curve fitted on "
        f"{args.softmax_curve}"
    )
    res = calibrate_operators(folder, gpu, opts, lambda s: print(s) if s.startswith("  ") else None)
    print(f"# usable samples: {res.samples} ({res.fwd_samples} fwd, {res.bwd_samples} bwd)")
    print("\n## achieved fraction of peak (median over each group's slower half; inventory FLOPs and bytes)")
    rows = [[a.operator, a.phase, a.samples, f"{a.flops_fraction:.2f}", f"{a.bytes_fraction:.2f}", f"{a.fastest_us:.1f}"] for a in res.achieved]
    print(_table(rows, ("operator", "phase", "samples", "FLOP/s / peak", "bytes/s / HBM peak", "fastest sample us")))
    f = res.holdout_fit
    print(
        f"\n## fit on {f.samples} samples (80 %), op curves {f.op_curves}: {f.layout.size} parameters, "
        f"{f.evaluations} evaluations, status {f.status}, {f.seconds:.0f} s"
    )
    print(_fmt_fit(f))
    if res.compare_fit is not None:
        c = res.compare_fit
        print(
            f"\n## comparison fit on the same 80 %, op curves {c.op_curves}: {c.layout.size} parameters, "
            f"{c.evaluations} evaluations, status {c.status}, {c.seconds:.0f} s"
        )
        print(_fmt_fit(c))
    print(
        f"\n## hold-out errors ({res.holdout_samples} samples never fitted; err = predicted/measured - 1; "
        f"columns per op-curves mode: {', '.join(res.holdout_labels)})"
    )
    print(_table(_err_cells(res.holdout_rows), _err_header(res.holdout_labels)))
    if res.memory_curve_rows:
        print(
            "\n## hold-out errors of the memory-bound operators on the kind-level memory curve alone "
            "(what a memory-bound operator without a curve of its own gets)"
        )
        print(_table(_err_cells(res.memory_curve_rows), _err_header(None)))
    f = res.final_fit
    print(
        f"\n## final fit on all {f.samples} samples: {f.layout.size} parameters, {f.evaluations} evaluations, "
        f"status {f.status}, {f.seconds:.0f} s"
    )
    print(_fmt_fit(f))
    print("\n## in-sample errors of the final fit")
    print(_table(_err_cells(res.in_sample_rows), _err_header(None)))
    print("\n" + res.block)
    if args.update_catalog:
        path = catalog_file("gpus", gpu.name)
        replace_efficiency_block(path, res.block)
        print(f"\n# wrote the efficiency block into {rel_path(path)}")
    print(f"\n# done in {res.seconds:.1f} s")
    return 0


def cmd_links(args: argparse.Namespace) -> int:
    opts = LinkOptions(intra_topology=args.intra_topology, seed=args.seed, holdout=args.holdout, loss=args.loss, date=args.date)
    res = calibrate_links(Path(args.dir), args.cluster, opts)
    base = res.cluster
    print(f"# links: {res.folder} on cluster {base.name} ({base.gpu.name}, {base.gpus_per_node} per node)")
    print(f"# seed {args.seed}, hold-out {args.holdout:.0%}, loss {args.loss}")
    for t in res.topologies:
        print(
            f"# intra-node topology {t.topology or 'n/a (1 GPU per node)'}: fitted "
            f"{', '.join(t.params)} in {t.evaluations} evaluations, "
            f"weighted sum of squared log errors {t.cost:.4f}"
        )
    if len(res.topologies) > 1:
        print(
            f"# chosen intra-node topology: {res.chosen.topology} (lower weighted squared log error: "
            + ", ".join(f"{t.topology} {t.cost:.4f}" for t in res.topologies)
            + ")"
        )
    print("\n## files (exclusions as checked against the chosen topology)")
    print("\n".join(res.notes))
    print("\n## fitted links")
    for link in res.links:
        p2p = link.p2p_efficiency if link.p2p_efficiency is None else round(link.p2p_efficiency, 4)
        print(
            f"  {link.side}: bandwidth {link.bandwidth_bytes_per_s / 1e9:.0f} GB/s ({link.topology}), "
            f"efficiency {link.efficiency:.4f} (bus {link.bus_bytes_per_s / 1e9:.2f} GB/s), "
            f"p2p_efficiency {p2p} (p2p {link.p2p_bytes_per_s / 1e9:.2f} GB/s), latency {link.latency_s / US:.2f} us"
        )
    print(
        "\n## per-config errors (err = predicted/measured - 1; hold-out: fit on 80 % of the "
        "all-reduce/p2p rows, scored on the other 20 %; other columns: final fit on all rows)"
    )
    rows = []
    for r in res.rows:
        if r.errors is None:
            rows.append([r.config, r.kind, r.rows, r.excluded, "-", "-", "-", "-", "-"])
            continue
        hold = "-" if r.holdout_median_abs is None else f"{r.holdout_median_abs:.1f}"
        rows.append([r.config, r.kind, r.rows, r.excluded, "yes" if r.fitted else "no (reported)", hold,
                     f"{r.errors.median_abs:.1f}", f"{r.errors.mean_abs:.1f}", f"{r.errors.median:+.1f}"])
    header = ("config", "kind", "rows", "excluded", "fitted", "hold-out median |err| %", "median |err| %", "mean |err| %", "median err %")
    print(_table(rows, header))
    h, a = res.holdout, res.in_sample
    print(
        f"\n# all-reduce + p2p: hold-out median |err| {h.median_abs:.1f}%, mean {h.mean_abs:.1f}%; "
        f"all rows median {a.median_abs:.1f}%, mean {a.mean_abs:.1f}%"
    )
    if res.all_gather is not None:
        g = res.all_gather
        print(f"# all-gather (not fitted): median |err| {g.median_abs:.1f}%, mean {g.mean_abs:.1f}%, median err {g.median:+.1f}%")
    print("\n" + res.block)
    print(f"\n# done in {res.seconds:.1f} s")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--seed", type=int, default=0)
    common.add_argument("--holdout", type=float, default=0.2)
    common.add_argument("--loss", default="linear", choices=["linear", "soft_l1", "huber", "cauchy"])
    common.add_argument("--date", default=None)
    ops = sub.add_parser("operators", parents=[common])
    ops.add_argument("dir")
    ops.add_argument("--gpu", required=True)
    ops.add_argument("--precision", default="fp16")
    ops.add_argument("--max-nfev", type=int, default=400)
    ops.add_argument("--op-curves", default="memory+bmm", choices=OP_CURVE_MODES)
    ops.add_argument("--min-samples", type=int, default=40)
    ops.add_argument("--softmax-curve", default="softmax", choices=[*SOFTMAX_TAGS, "both"])
    ops.add_argument("--kernel-overhead-us", type=float, default=None)
    ops.add_argument("--compare", default="none", choices=[*OP_CURVE_MODES, "off"])
    ops.add_argument("--update-catalog", action="store_true")
    ops.set_defaults(func=cmd_operators)
    links = sub.add_parser("links", parents=[common])
    links.add_argument("dir")
    links.add_argument("--cluster", required=True)
    links.add_argument("--intra-topology", default="auto", choices=["auto", "mesh", "switch"])
    links.set_defaults(func=cmd_links)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
