"""A tiny GPT for the CPU and the three ways `tinyrun` spreads it over processes.

Everything here imports torch; `tinyrun` imports this module only inside the spawned workers,
so `import paraplan.traces` stays free of torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TinyConfig:
    """Small enough that one iteration on two CPU processes takes tens of milliseconds."""

    num_layers: int = 2
    hidden_size: int = 64
    num_attention_heads: int = 4
    seq_length: int = 64
    vocab_size: int = 512
    micro_batch_size: int = 4
    num_microbatches: int = 2  # pipeline mode only


class Block(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.heads = cfg.num_attention_heads
        self.ln1 = nn.LayerNorm(h, bias=False)
        self.qkv = nn.Linear(h, 3 * h, bias=False)
        self.proj = nn.Linear(h, h, bias=False)
        self.ln2 = nn.LayerNorm(h, bias=False)
        self.fc1 = nn.Linear(h, 4 * h, bias=False)
        self.fc2 = nn.Linear(4 * h, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyGPT(nn.Module):
    """Embedding, blocks, final norm and LM head; `stage` keeps only its share of the layers."""

    def __init__(self, cfg: TinyConfig, stage: int = 0, num_stages: int = 1) -> None:
        super().__init__()
        per = cfg.num_layers // num_stages
        self.first, self.last = stage == 0, stage == num_stages - 1
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size) if self.first else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(per))
        self.ln_f = nn.LayerNorm(cfg.hidden_size, bias=False) if self.last else None
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) if self.last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        if self.head is not None:
            x = self.head(self.ln_f(x))
        return x


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build_step(mode: str, cfg: TinyConfig, rank: int, world: int):
    """Return a function that runs one training iteration (forward, backward, optimizer)."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1234 + rank)

    def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, cfg.vocab_size, (n, cfg.seq_length + 1), generator=gen)
        return tokens[:, :-1], tokens[:, 1:]

    if mode == "pipeline":
        return _pipeline_step(cfg, rank, world, batch)
    model = TinyGPT(cfg)
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model, bucket_cap_mb=0.25)
    elif mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    else:
        raise ValueError(f"unknown mode {mode!r}: ddp, fsdp or pipeline")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)

    def step() -> float:
        x, y = batch(cfg.micro_batch_size)
        loss = lm_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return step


def _pipeline_step(cfg: TinyConfig, rank: int, world: int, batch):
    """A GPipe schedule over `world` stages (torch.distributed.pipelining; p2p send/recv)."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    model = TinyGPT(cfg, stage=rank, num_stages=world)
    stage = PipelineStage(model, rank, world, torch.device("cpu"), group=dist.group.WORLD)
    schedule = ScheduleGPipe(stage, n_microbatches=cfg.num_microbatches, loss_fn=lm_loss)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    n = cfg.micro_batch_size * cfg.num_microbatches

    def step() -> float:
        x, y = batch(n)  # every rank draws the same-shaped batch; only the ends use theirs
        if rank == 0:
            schedule.step(x)
            loss = 0.0
        elif rank == world - 1:
            losses: list[torch.Tensor] = []
            schedule.step(target=y, losses=losses)
            loss = (sum(losses) / len(losses)).item()
        else:
            schedule.step()
            loss = 0.0
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step
