"""`paraplan compare A.yaml B.yaml`: two predictions side by side, and B - A."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from paraplan.cli.common import (
    JOB_FLAGS,
    Backend,
    Format,
    ModelsFile,
    OutputFormat,
    err,
    out,
    takes_flags,
    user_errors,
    write_text,
)
from paraplan.cli.loading import load_flagged_job, pair_intervals, predict_flagged

if TYPE_CHECKING:
    from paraplan.prediction.compare import Comparison
    from paraplan.uncertainty import Interval
    from paraplan.uncertainty.pair import RatioInterval

Opt = typer.Option


@takes_flags(JOB_FLAGS)
def compare_command(
    job_files: Annotated[list[Path] | None, typer.Argument(
        help="Job files A and B; one file (or none: the demo job) is A, and B is A with --vs.",
        metavar="A.yaml [B.yaml]", show_default=False)] = None,
    vs: Annotated[list[str] | None, Opt(
        "--vs", metavar="FLAG=VALUE", help="B is A with this job flag changed, e.g. --vs tp=4 --vs zero-stage=3 (repeatable).")] = None,
    flags: dict[str, Any] | None = None,
    backend: Backend = "analytical",
    models: ModelsFile = None,
    output: Format = OutputFormat.table,
    interval: Annotated[float, Opt(
        "--interval", metavar="LEVEL",
        help="The level of each plan's uncertainty interval and of the ratio B / A's (0 < LEVEL < 1). Two plans "
        "in one regime share most of their error: whether B differs from A is judged on the ratio's interval, "
        "from the differences between dev runs of one source, not on the plans' own ranges.")] = 0.8,
) -> None:
    """Predict two jobs, or one job under two plans, and show them side by side: iteration
    time, tokens/s, MFU, memory per GPU (and whether it fits), cost, and every breakdown
    component, with B - A and its percentage of A. The job flags apply to both."""
    from paraplan.prediction.compare import compare_predictions
    from paraplan.report.compare import comparison_rows, render_comparison
    from paraplan.report.formats import render_csv, render_json
    from paraplan.specs import ConfigError
    from paraplan.uncertainty import check_level

    files, flags = list(job_files or []), flags or {}
    with user_errors():
        check_level(interval)
        if len(files) > 2 or (len(files) < 2 and not vs):
            raise ConfigError(f"job_files: compare takes two job files (A B), or one (or none: the demo job) "
                              f"with --vs, e.g. --vs tp=4; got {len(files)} file(s)"
                              + (" and --vs" if vs else ""))
        a_file = files[0] if files else None
        b_file = files[1] if len(files) == 2 else a_file
        flags_b = flags_of_b(flags, parse_vs(vs or []))
        job_a, said = load_flagged_job(a_file, flags)
        job_b, said_b = load_flagged_job(b_file, flags_b)
        (a, notes_a), (b, notes_b) = predict_flagged(job_a, backend, models), predict_flagged(job_b, backend, models)
        comparison = compare_predictions(a, b)
        bounds = pair_intervals(job_a, job_b, a, b, interval, backend, models)
    # B's demo line would repeat A's: it is A with --vs; a note of one job only names it
    notes = [n if n in notes_b else f"A: {n}" for n in notes_a] + [f"B: {n}" for n in notes_b if n not in notes_a]
    for note in [n for n in (said, said_b if b_file != a_file else None) if n] + [f"note: {n}" for n in notes]:
        err.print(note, highlight=False, soft_wrap=True)
    names = (str(a_file or "demo job"), str(b_file or "demo job") + (" with --vs" if vs else ""))
    with user_errors():  # a non-finite number is an internal error (exit 3), never output
        if output is OutputFormat.json:
            write_text(render_json(comparison_data(comparison, bounds)))
        elif output is OutputFormat.csv:
            write_text(render_csv(comparison_rows(comparison, bounds)))
        else:
            out.print(render_comparison(comparison, names, bounds))


def comparison_data(comparison: Comparison, bounds: tuple[Interval, Interval, RatioInterval]) -> dict[str, Any]:
    """What ``paraplan compare --format json`` prints (the web page sends the same): the
    comparison with A's, B's and the ratio B / A's intervals (``pair_intervals``)."""
    ia, ib, ratio = bounds
    return {**comparison.to_dict(), "interval": {
        "a": ia.to_dict(comparison.a), "b": ib.to_dict(comparison.b), "b_over_a": ratio.to_dict()}}


def flags_of_b(flags: dict[str, Any], changed: dict[str, Any]) -> dict[str, Any]:
    """The job flags with B's changes; a model named by one flag replaces one named by the other."""
    if "model" in changed or "hf_config" in changed:
        return {**flags, "model": None, "hf_config": None, **changed}
    return {**flags, **changed}


def parse_vs(items: list[str]) -> dict[str, Any]:
    """``--vs tp=4`` as the job flags of B: each a job flag's name (``tp``, ``zero-stage``,
    ``zero_stage``, ``--tensor-model-parallel-size``) and a value of its type."""
    from paraplan.specs import ConfigError

    names = {}
    for f in JOB_FLAGS:
        decls = [d for d in (f.option.default, *(f.option.param_decls or ())) if isinstance(d, str)]
        for d in (f.name, *(part for decl in decls for part in decl.split("/"))):
            names[d.lstrip("-").replace("-", "_")] = f
    given: dict[str, Any] = {}
    for item in items:
        name, eq, value = item.partition("=")
        key = name.strip().lstrip("-").replace("-", "_")
        if not eq or not value.strip() or key not in names:
            raise ConfigError(f"vs: {item!r} is not FLAG=VALUE with a job flag of predict, e.g. tp=4 or zero-stage=3")
        flag, value = names[key], value.strip()
        if flag.name == "sequence_parallel":
            if value.lower() not in ("on", "off", "true", "false"):
                raise ConfigError(f"vs: {item!r}: sequence-parallel is on or off")
            given[flag.key] = value.lower() in ("on", "true") and not key.startswith("no_")
            continue
        kind = next((t for t in (int, float, Path) if t in getattr(flag.type, "__args__", ())), str)
        try:
            given[flag.key] = str(Path(value).absolute()) if kind is Path else kind(value)
        except ValueError:
            raise ConfigError(f"vs: {item!r}: {name.strip()} takes {'a whole number' if kind is int else 'a number'}"
                              ) from None
    return given
