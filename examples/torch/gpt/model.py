"""The small GPT of examples/gpt/model.py in PyTorch, for `ppdsl run --framework torch`.

    ppdsl run schedules/zbv.pps --framework torch --model examples/torch/gpt/model.py --steps 50 --optimizer adam --lr 3e-3

`--model` names this module: its `build_stage`, `batches` and `loss` are the model contract
(docs/runtime.md). The same architecture, sizes, stage cut and data as the Paddle example:
byte-level tokens (256 of them) from `examples/gpt/corpus.txt`; token and position embeddings,
pre-norm transformer blocks built from `torch.nn` pieces, a final norm and an LM head,
cross-entropy. Every matmul is a `torch.nn.Linear`, so split-backward schedules split all of
them.

Stages hand each other a tuple `(hidden, mask)`: the hidden states need a gradient back, the
additive attention mask (causal, built once by the first stage) does not, so it is sent forward
only. The blocks are shared out evenly; a pipeline with more stages than `BLOCKS` gets one
block per stage.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 256
DIM, HEADS, BLOCKS = 32, 2, 8
CONTEXT = 32   # tokens per sequence
BATCH = 16     # sequences per step: splits into 1, 2, 4, 8 or 16 microbatches
CORPUS = Path(__file__).parents[2] / "gpt" / "corpus.txt"  # the Paddle example's corpus


class Block(nn.Module):
    """Pre-norm: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.up, self.down = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(DIM, dim=-1)
        # [b, t, d] -> [b, heads, t, d / heads]
        q, k, v = (z.reshape(b, t, HEADS, DIM // HEADS).transpose(1, 2) for z in (q, k, v))
        scores = q.matmul(k.transpose(-2, -1)) / math.sqrt(DIM // HEADS) + mask
        att = F.softmax(scores, dim=-1).matmul(v).transpose(1, 2).reshape(b, t, DIM)
        x = x + self.proj(att)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Stage(nn.Module):
    """One pipeline stage: the embeddings first, the head last, blocks in between."""

    def __init__(self, stage_index: int, num_stages: int):
        super().__init__()
        self.first, self.last = stage_index == 0, stage_index == num_stages - 1
        total = max(BLOCKS, num_stages)
        lo, hi = stage_index * total // num_stages, (stage_index + 1) * total // num_stages
        if self.first:
            self.tokens, self.positions = nn.Embedding(VOCAB, DIM), nn.Embedding(CONTEXT, DIM)
        self.blocks = nn.ModuleList([Block() for _ in range(lo, hi)])
        if self.last:
            self.norm, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> object:
        if self.first:  # x: token ids [b, t]
            t = x.shape[1]
            mask = torch.triu(torch.full((t, t), -1e9, dtype=torch.get_default_dtype()), diagonal=1)
            mask = mask.reshape(1, 1, t, t).expand(x.shape[0], 1, t, t)
            x = self.tokens(x) + self.positions(torch.arange(t))
        assert mask is not None
        for block in self.blocks:
            x = block(x, mask)
        if self.last:
            return self.head(self.norm(x))  # logits [b, t, VOCAB]
        return x, mask


def build_stage(stage_index: int, num_stages: int) -> nn.Module:
    return Stage(stage_index, num_stages)


def build_tied_stage(stage_index: int, num_stages: int) -> nn.Module:
    """`build_stage` with the LM head's weight tied to the token embedding, as GPT-2 does:
    the first and last stages each hold a copy and say so in `ppdsl_tied`; ppdsl starts both
    from the first stage's value and sums their gradients every step.

        ppdsl run schedules/zbv.pps --model examples/torch/gpt/model.py:build_tied_stage --verify
    """
    stage = Stage(stage_index, num_stages)
    # The head's weight is [VOCAB, DIM], as the embedding table.
    if stage.first and stage.last:  # a one-stage pipeline holds both copies
        stage.ppdsl_tied = {"tokens.weight": "embedding", "head.weight": "embedding"}
    elif stage.first:
        stage.ppdsl_tied = {"tokens.weight": "embedding"}
    elif stage.last:
        stage.ppdsl_tied = {"head.weight": "embedding"}
    return stage


def parallelize(stage: nn.Module, mesh: object) -> None:
    """How a stage splits over tensor-parallel ranks (`ppdsl run --tp N`): each block's MLP as
    Megatron does, `up` split by output columns and `down` by input rows, so one all-reduce
    ends the pair and the block's output is whole on every rank. Attention, norms, embeddings
    and the head stay whole (its fused `qkv` would need its q, k and v split apart first)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    for block in stage.blocks:
        parallelize_module(block, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})


def batches(seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Random windows of the corpus: inputs are CONTEXT bytes, targets the next byte of each."""
    data = np.frombuffer(CORPUS.read_bytes(), dtype=np.uint8).astype("int64")
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(data) - CONTEXT - 1, size=BATCH)
        window = np.stack([data[s:s + CONTEXT + 1] for s in starts])
        yield torch.from_numpy(window[:, :-1].copy()), torch.from_numpy(window[:, 1:].copy())


def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
