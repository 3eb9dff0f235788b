"""Megatron-LM's ways of splitting the decoder layers over pipeline stages and virtual stages.

Megatron-LM gives every (virtual) stage num_layers / (pp x vpp) layers unless the job says
otherwise with one of (``megatron/training/arguments.py``, ``TransformerConfig``):

- ``--pipeline-model-parallel-layout`` (``PipelineParallelLayerLayout``, megatron/core/
  transformer/pipeline_parallel_layer_layout.py): a string of virtual stages separated by
  ``|`` in model order, ``E`` the embedding, ``L`` the loss (LM head), ``t`` a decoder layer,
  ``m`` an MTP layer; ``x*n`` and ``(...)*n`` repeat, commas are cosmetic. Virtual stage
  v = c x pp + i is chunk c of pipeline rank i, so the number of stages is pp x vpp; the
  embedding comes first and the loss last, each exactly once, and the decoder layers add up to
  num_layers. Example (the docs' DeepSeek-V3 at PP16 VPP2): ``Et*3|(tt|)*29,m|L``.
- ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``
  (``num_layers_in_first/last_pipeline_stage``): the first / last rank's layers, the others
  split evenly over the middle ranks; with vpp each rank's count splits evenly over its chunks.
- ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``:
  the embedding / the loss counts as one layer in the even split, so the first / last virtual
  stage holds one decoder layer fewer ((num_layers + 1 or 2) / (pp x vpp) each).

``stage_grid`` turns any of them (or ``layers_per_stage``, whose stages split evenly into their
chunks) into the decoder layers of each rank's chunks; bad input raises a one-line ValueError
naming the field.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from paraplan.specs.plan import ParallelPlan

LAYOUT = "parallel.pipeline_model_parallel_layout"
# the plan fields that state a split in Megatron-LM's terms
SPLIT_FIELDS = ("pipeline_model_parallel_layout", "decoder_first_pipeline_num_layers",
                "decoder_last_pipeline_num_layers", "account_for_embedding_in_pipeline_split",
                "account_for_loss_in_pipeline_split")
_LAYER_CHARS = frozenset("ELtm")
# Megatron's own unrolling: a parenthesised group times n, then one character times n
_GROUP = re.compile(r"\(([^)]+)\)\*(\d+)")
_CHAR = re.compile(r"(.)\*(\d+)")


@functools.lru_cache(maxsize=64)
def parse_layout(text: str) -> tuple[str, ...]:
    """The layout's virtual stages in model order, each as its string of layer characters
    (Megatron's ``parse_str_to_list``): ``"Et*3|(tt|)*2,L"`` -> ``("Ettt", "tt", "ttL")``."""
    unrolled = text.replace(",", "").replace(" ", "")
    for pattern in (_GROUP, _CHAR):
        unrolled = pattern.sub(lambda g: g.group(1) * int(g.group(2)), unrolled)
    stages = tuple(unrolled.split("|"))
    bad = sorted({c for stage in stages for c in stage} - _LAYER_CHARS)
    if bad:
        raise ValueError(f"{LAYOUT}: {text!r} has {', '.join(map(repr, bad))}; a layout is virtual stages "
                         "separated by '|' of E (embedding), t (decoder layer), m (MTP layer), L (loss), "
                         "with x*n and (...)*n repeats")
    return stages


def check_layout(text: str, pp: int) -> int:
    """The layout's vpp (virtual stages per pipeline rank), after Megatron's checks that need
    no model: the stages divide over pp, the embedding first and the loss last, once each."""
    stages = parse_layout(text)
    if len(stages) % pp:
        raise ValueError(f"{LAYOUT}: {len(stages)} virtual stages do not divide over pp={pp} ranks "
                         "(a layout gives pp x vpp stages)")
    flat = "".join(stages)
    if flat.count("E") != 1 or not flat.startswith("E"):
        raise ValueError(f"{LAYOUT}: the embedding E must come first, exactly once ({text!r})")
    if flat.count("L") != 1 or not flat.endswith("L"):
        raise ValueError(f"{LAYOUT}: the loss L must come last, exactly once ({text!r})")
    if "m" in flat:
        raise ValueError(f"{LAYOUT}: 'm' places an MTP layer, which paraplan does not model yet; "
                         "leave the MTP layers out of the layout")
    return len(stages) // pp


def stage_grid(num_layers: int, plan: ParallelPlan) -> tuple[tuple[int, ...], ...]:
    """The decoder layers of each pipeline rank's chunks: ``grid[i][c]`` for rank i, chunk c
    (``plan.schedule.virtual_stage`` says where chunk c sits in the model)."""
    return _grid(num_layers, plan.pp, plan.schedule.chunks(plan.vpp), plan.pipeline_model_parallel_layout,
                 plan.decoder_first_pipeline_num_layers, plan.decoder_last_pipeline_num_layers,
                 plan.account_for_embedding_in_pipeline_split, plan.account_for_loss_in_pipeline_split,
                 plan.layers_per_stage)


def split_given(plan: ParallelPlan) -> bool:
    """Whether the plan states its split (any of the Megatron-LM fields or layers_per_stage)."""
    return plan.layers_per_stage is not None or any(getattr(plan, name) for name in SPLIT_FIELDS)


@functools.lru_cache(maxsize=1024)
def _grid(num_layers: int, pp: int, chunks: int, layout: str | None, first: int | None, last: int | None,
          embedding: bool, loss: bool, per_stage: tuple[int, ...] | None) -> tuple[tuple[int, ...], ...]:
    if layout is not None:
        stages = parse_layout(layout)
        decoders = sum(s.count("t") for s in stages)
        if decoders != num_layers:
            raise ValueError(f"{LAYOUT}: places {decoders} decoder layers (t) but the model has "
                             f"num_layers={num_layers}")
        return tuple(tuple(stages[c * pp + i].count("t") for c in range(chunks)) for i in range(pp))
    if first is not None or last is not None:
        return _first_last(num_layers, pp, chunks, first, last)
    if embedding or loss:
        return _accounted(num_layers, pp, chunks, embedding, loss)
    if per_stage is not None:
        bad = [i for i, n in enumerate(per_stage) if n % chunks]
        if bad:
            raise ValueError(f"parallel.layers_per_stage: stage {bad[0]}'s {per_stage[bad[0]]} layers do not "
                             f"split into its {chunks} model chunks; give each virtual stage's layers with "
                             "pipeline_model_parallel_layout (e.g. 'Et*3|t*2|...|L')")
        return tuple((n // chunks,) * chunks for n in per_stage)
    if num_layers % (pp * chunks) == 0:
        return ((num_layers // (pp * chunks),) * chunks,) * pp
    if chunks > 1:
        raise ValueError(f"parallel.vpp: num_layers={num_layers} is not divisible by pp*vpp = {pp * chunks}; "
                         "give the split with pipeline_model_parallel_layout or decoder_first/last_pipeline_num_layers")
    base, extra = divmod(num_layers, pp)  # the first stages one layer longer (DeepSpeed, torchtitan)
    return tuple((base + (1 if i < extra else 0),) for i in range(pp))


def _first_last(num_layers: int, pp: int, chunks: int, first: int | None, last: int | None) -> tuple[tuple[int, ...], ...]:
    """Megatron-LM's uneven split: the first / last rank's layers given, the rest even."""
    if pp < 2:
        raise ValueError("parallel.decoder_first_pipeline_num_layers: an uneven split needs pp >= 2")
    middle = pp - (first is not None) - (last is not None)
    rest = num_layers - (first or 0) - (last or 0)
    name = "decoder_first_pipeline_num_layers" if first is not None else "decoder_last_pipeline_num_layers"
    if rest < 0 or (middle == 0 and rest) or (middle and rest % middle):
        raise ValueError(f"parallel.{name}: the other {num_layers} - {first or 0} - {last or 0} = {rest} layers "
                         f"do not split evenly over the {middle} middle stage{'s' if middle != 1 else ''}")
    even = rest // middle if middle else 0
    counts = [even] * pp
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    for i, n in enumerate(counts):
        if n % chunks:
            field = ("decoder_first_pipeline_num_layers" if i == 0 and first is not None else
                     "decoder_last_pipeline_num_layers" if i == pp - 1 and last is not None else "vpp")
            raise ValueError(f"parallel.{field}: stage {i}'s {n} layers do not split into vpp={chunks} equal "
                             "chunks (Megatron-LM needs it); use pipeline_model_parallel_layout instead")
        if n == 0:
            raise ValueError(f"parallel.{name}: stage {i} would hold no decoder layer")
    return tuple((n // chunks,) * chunks for n in counts)


def _accounted(num_layers: int, pp: int, chunks: int, embedding: bool, loss: bool) -> tuple[tuple[int, ...], ...]:
    """The embedding and/or the loss counted as a layer of the even split."""
    field = "account_for_embedding_in_pipeline_split" if embedding else "account_for_loss_in_pipeline_split"
    total = num_layers + embedding + loss
    if total % (pp * chunks):
        raise ValueError(f"parallel.{field}: num_layers={num_layers} + {int(embedding) + int(loss)} "
                         f"(embedding/loss) = {total} is not divisible by pp x vpp = {pp * chunks}")
    each = total // (pp * chunks)
    grid = [[each] * chunks for _ in range(pp)]
    grid[0][0] -= embedding
    grid[-1][-1] -= loss
    if min(sum(row) for row in grid) < 1:
        raise ValueError(f"parallel.{field}: a stage would hold no decoder layer")
    return tuple(tuple(row) for row in grid)
