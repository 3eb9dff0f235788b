"""torchtitan's per-op selective activation checkpointing, run: the installed torchtitan 0.3.0's
``SelectiveAC`` wraps two toy Llama blocks (its forward's call order: ``wq wk wv`` or one
``wqkv``, attention, ``wo``, then ``self.w2(F.silu(self.w1(x)) * self.w3(x))``) on the CPU, and
the matmuls its policy re-runs are the ones paraplan's ``op_policy_weights`` re-runs for the
same projections. Skips without torch or torchtitan 0.3.0 (``paraplan[frameworks]``)."""

from __future__ import annotations

import pytest

from paraplan.catalog import resolve_job
from paraplan.inventory import OpKind, count_job
from paraplan.inventory.recompute import op_policy_weights

torch = pytest.importorskip("torch")
pytest.importorskip("torchtitan", reason="torchtitan is installed with paraplan[frameworks]")

# torchtitan's module names as paraplan's inventory names the GEMMs
ROLES = {"wq": "query projection", "wk": "key projection", "wv": "value projection", "wqkv": "QKV projection",
         "wo": "attention output projection", "w1": "MLP gate projection", "w3": "MLP up projection",
         "w2": "MLP down projection"}
DIM, KV, FFN = 64, 16, 96


def _toy_model(fused_qkv: bool):
    nn, F = torch.nn, torch.nn.functional

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            if fused_qkv:
                self.wqkv = nn.Linear(DIM, DIM + 2 * KV, bias=False)
            else:
                self.wq, self.wk, self.wv = (nn.Linear(DIM, n, bias=False) for n in (DIM, KV, KV))
            self.wo = nn.Linear(DIM, DIM, bias=False)

        def forward(self, x):
            if fused_qkv:
                q, k, v = self.wqkv(x).split([DIM, KV, KV], dim=-1)
            else:
                q, k, v = self.wq(x), self.wk(x), self.wv(x)
            b, s, _ = x.shape
            q = q.view(b, s, 4, 16).transpose(1, 2)
            k, v = (t.view(b, s, 1, 16).transpose(1, 2).expand(b, 4, s, 16) for t in (k, v))
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.wo(out.transpose(1, 2).reshape(b, s, DIM))

    class FeedForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1, self.w2, self.w3 = (nn.Linear(i, o, bias=False) for i, o in ((DIM, FFN), (FFN, DIM), (DIM, FFN)))

        def forward(self, x):
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention, self.feed_forward = Attention(), FeedForward()
            self.attention_norm, self.ffn_norm = nn.RMSNorm(DIM), nn.RMSNorm(DIM)

        def forward(self, x):
            h = x + self.attention(self.attention_norm(x))
            return h + self.feed_forward(self.ffn_norm(h))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleDict({str(i): Block() for i in range(2)})

        def forward(self, x):
            for layer in self.layers.values():
                x = layer(x)
            return x

    return Model()


def _torchtitan_reruns(fused_qkv: bool, monkeypatch) -> list[list[str]]:
    """Per block, the projections whose matmul torchtitan's policy re-runs (forward pass)."""
    import torchtitan.distributed.activation_checkpoint as ac
    from torch.utils.checkpoint import CheckpointPolicy

    decided: list[tuple[int, CheckpointPolicy]] = []
    contexts = ac.create_selective_checkpoint_contexts

    def recording(policy):
        def wrapped(ctx, func, *args, **kwargs):
            choice = policy(ctx, func, *args, **kwargs)
            if func == torch.ops.aten.mm.default and not ctx.is_recompute:
                decided.append((args[1].data_ptr(), choice))
            return choice
        return contexts(wrapped)

    monkeypatch.setattr(ac, "create_selective_checkpoint_contexts", recording)
    torch.manual_seed(0)
    model = _toy_model(fused_qkv)
    where = {m.weight.data_ptr(): name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    ac.SelectiveAC(ac.SelectiveAC.Config(force_recompute_mm_shapes_by_fqns=[])).apply(model)
    model(torch.randn(2, 8, DIM, requires_grad=True)).sum().backward()
    blocks: dict[str, list[str]] = {}
    for ptr, choice in decided:
        layer, name = where[ptr].split(".")[1], where[ptr].split(".")[-1]
        blocks.setdefault(layer, [])
        if choice is CheckpointPolicy.PREFER_RECOMPUTE:
            blocks[layer].append(ROLES[name])
    return list(blocks.values())


@pytest.mark.slow
@pytest.mark.parametrize(("framework", "fused_qkv"), [("torchtitan-0.1", False), ("torchtitan-0.3", True)])
def test_paraplan_reruns_the_matmuls_torchtitan_s_selective_ac_reruns(framework, fused_qkv, monkeypatch):
    from importlib.metadata import version

    if version("torchtitan") != "0.3.0":
        pytest.skip(f"torchtitan {version('torchtitan')} is installed, the policy read is 0.3.0's")
    job = resolve_job({"model": "llama-3-8b", "cluster": {"name": "dgx-h100", "num_nodes": 1},
                       "parallel": {"framework": framework, "micro_batch_size": 1, "global_batch_size": 8,
                                    "recompute": "op"}})
    ops = count_job(job).stages[0].layer_ops
    ours = [op.role for op, w in zip(ops, op_policy_weights(ops), strict=True) if op.kind is OpKind.GEMM and w]
    # the count starts again in every block: both blocks re-run the same projections
    assert _torchtitan_reruns(fused_qkv, monkeypatch) == [ours, ours]


@pytest.mark.slow
def test_a_matmul_on_tensor_subclasses_reaches_the_policy_as_aten_mm_not_as_the_kernel_it_runs():
    """torchao's float8 linears multiply float8 tensor subclasses with ``torch.mm``; the subclass
    then runs ``torch._scaled_mm``. The checkpoint's dispatch mode sees the ``aten.mm`` first (and
    not the kernel the subclass runs inside), so a float8 linear counts in torchtitan's matmul
    count like a bf16 one. Here a subclass whose mm runs ``aten.addmm`` stands in for it."""
    from torch.utils._pytree import tree_map
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    class Wrapped(torch.Tensor):
        @staticmethod
        def __new__(cls, t):
            return torch.Tensor._make_wrapper_subclass(cls, t.shape, dtype=t.dtype)

        def __init__(self, t):
            self.t = t

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            plain = tree_map(lambda a: a.t if isinstance(a, Wrapped) else a, args)
            if func is torch.ops.aten.mm.default:
                return torch.ops.aten.addmm.default(torch.zeros(1), *plain)
            return func(*plain, **(kwargs or {}))

    seen = []

    def policy(ctx, func, *args, **kwargs):
        seen.append(func)
        return CheckpointPolicy.PREFER_RECOMPUTE

    w = torch.randn(DIM, DIM, requires_grad=True)

    def block(x):
        return torch.mm(Wrapped(x.detach()), Wrapped(w.detach())) + x @ w

    checkpoint(block, torch.randn(4, DIM, requires_grad=True), use_reentrant=False,
               context_fn=lambda: create_selective_checkpoint_contexts(policy))
    assert seen.count(torch.ops.aten.mm.default) == 2 and torch.ops.aten.addmm.default not in seen
