"""The optimizer step reads what it must: the gradient norm for clipping, then Adam's state."""

import pytest

from paraplan.catalog import resolve_job
from paraplan.inventory import count_job


def test_the_step_reads_gradients_twice_moves_the_fp32_state_and_writes_the_weights():
    job = resolve_job({"model": "llama-2-7b", "cluster": {"name": "dgx-a100"},
                       "parallel": {"zero_stage": 1, "global_batch_size": 8}, "precision": "bf16"})
    st = count_job(job).stages[0]
    owned = st.params / 8  # ZeRO-1 over 8 data-parallel ranks
    # fp32 gradients (Megatron, bf16): norm read + Adam read = 2 x 4; moments and master weight
    # read and written: 2 x 12; bf16 weight written: 2
    assert st.optimizer.bytes == pytest.approx(owned * (2 * 4 + 2 * 12 + 2))
