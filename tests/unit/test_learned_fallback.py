"""The learned backend's roofline fallback: priced with the plan's kernel settings, as the
analytical backend prices them."""

from paraplan.catalog import resolve_job
from paraplan.costmodel import AnalyticalCostModel
from paraplan.inventory import OpKind, count_job
from paraplan.prediction.backends import ModelSet, make_cost_model
from paraplan.specs import Phase


def test_an_operator_without_a_regressor_is_priced_with_the_plans_attention_kernel_and_queued_gap():
    job = resolve_job({"model": "llama-3-8b", "cluster": {"name": "dgx-h100", "num_nodes": 1},
                       "parallel": {"tp": 2, "micro_batch_size": 1, "global_batch_size": 8,
                                    "attention_kernel": "fa3", "queued_kernel_gap": True}})
    learned = make_cost_model(job, "learned", ModelSet(models={}, metadata={}))  # no regressors: every op falls back
    with_plan = AnalyticalCostModel.of_plan(job.cluster, job.precision, job.parallel)
    without = AnalyticalCostModel(job.cluster, job.precision)
    ops = [op for b in count_job(job).stages[0].blocks for op in b.ops]
    learned_s = [learned.estimate_op_s(op, Phase.FWD) for op in ops]
    assert learned_s == [with_plan.estimate_op_s(op, Phase.FWD) for op in ops]
    # the settings price something: the kernels get the queued gap, the attention its kernel's curve
    plain_s = [without.estimate_op_s(op, Phase.FWD) for op in ops]
    attention = [i for i, op in enumerate(ops) if op.kind is OpKind.ATTENTION]
    others = [i for i in range(len(ops)) if i not in attention]
    assert sum(learned_s[i] for i in others) > sum(plain_s[i] for i in others)  # the queued gap
    gap_only = AnalyticalCostModel(job.cluster, job.precision, queued_gap=True)
    assert attention and all(learned_s[i] != gap_only.estimate_op_s(ops[i], Phase.FWD) for i in attention)
