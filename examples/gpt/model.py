"""A small GPT for `ppdsl run`, cut into any number of pipeline stages.

    ppdsl run schedules/zbv.pps --model examples/gpt/model.py --steps 50 --optimizer adam --lr 3e-3

`--model` names this module: its `build_stage`, `batches` and `loss` are the model contract
(docs/runtime.md). Byte-level tokens (256 of them) from `corpus.txt`, which ships beside this
file; token and position embeddings, pre-norm transformer blocks built from `paddle.nn`
pieces, a final norm and an LM head, cross-entropy. Every matmul is a `paddle.nn.Linear`.

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
import paddle
import paddle.nn.functional as F
from paddle import nn

VOCAB = 256
DIM, HEADS, BLOCKS = 32, 2, 8
CONTEXT = 32   # tokens per sequence
BATCH = 16     # sequences per step: splits into 1, 2, 4, 8 or 16 microbatches
CORPUS = Path(__file__).with_name("corpus.txt")


class Block(nn.Layer):
    """Pre-norm: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.proj = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.up, self.down = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x: paddle.Tensor, mask: paddle.Tensor) -> paddle.Tensor:
        b, t, _ = x.shape
        q, k, v = paddle.split(self.qkv(self.norm1(x)), 3, axis=-1)
        # [b, t, d] -> [b, heads, t, d / heads]
        q, k, v = (z.reshape([b, t, HEADS, DIM // HEADS]).transpose([0, 2, 1, 3]) for z in (q, k, v))
        scores = paddle.matmul(q, k, transpose_y=True) / math.sqrt(DIM // HEADS) + mask
        att = paddle.matmul(F.softmax(scores, axis=-1), v).transpose([0, 2, 1, 3]).reshape([b, t, DIM])
        x = x + self.proj(att)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Stage(nn.Layer):
    """One pipeline stage: the embeddings first, the head last, blocks in between."""

    def __init__(self, stage_index: int, num_stages: int):
        super().__init__()
        self.first, self.last = stage_index == 0, stage_index == num_stages - 1
        total = max(BLOCKS, num_stages)
        lo, hi = stage_index * total // num_stages, (stage_index + 1) * total // num_stages
        if self.first:
            self.tokens, self.positions = nn.Embedding(VOCAB, DIM), nn.Embedding(CONTEXT, DIM)
        self.blocks = nn.LayerList([Block() for _ in range(lo, hi)])
        if self.last:
            self.norm, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB)

    def forward(self, x: paddle.Tensor, mask: paddle.Tensor | None = None) -> object:
        if self.first:  # x: token ids [b, t]
            t = x.shape[1]
            mask = paddle.triu(paddle.full([t, t], -1e9, dtype=paddle.get_default_dtype()), diagonal=1)
            mask = mask.reshape([1, 1, t, t]).expand([x.shape[0], 1, t, t])
            x = self.tokens(x) + self.positions(paddle.arange(t))
        assert mask is not None
        for block in self.blocks:
            x = block(x, mask)
        if self.last:
            return self.head(self.norm(x))  # logits [b, t, VOCAB]
        return x, mask


def build_stage(stage_index: int, num_stages: int) -> nn.Layer:
    return Stage(stage_index, num_stages)


class TiedHead(nn.Layer):
    """The LM head with its weight laid out as the token embedding's, [VOCAB, DIM] (a
    `paddle.nn.Linear` holds [DIM, VOCAB]), so that the two can be one parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = self.create_parameter([VOCAB, DIM])
        self.bias = self.create_parameter([VOCAB], is_bias=True)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return paddle.matmul(x, self.weight, transpose_y=True) + self.bias


def build_tied_stage(stage_index: int, num_stages: int) -> nn.Layer:
    """`build_stage` with the LM head's weight tied to the token embedding, as GPT-2 does:
    the first and last stages each hold a copy and say so in `ppdsl_tied`; ppdsl starts both
    from the first stage's value and sums their gradients every step.

        ppdsl run schedules/zbv.pps --model examples/gpt/model.py:build_tied_stage --verify
    """
    stage = Stage(stage_index, num_stages)
    ties = {}
    if stage.first:
        ties["tokens.weight"] = "embedding"
    if stage.last:
        stage.head = TiedHead()
        ties["head.weight"] = "embedding"
    stage.ppdsl_tied = ties
    return stage


def batches(seed: int = 0) -> Iterator[tuple[paddle.Tensor, paddle.Tensor]]:
    """Random windows of the corpus: inputs are CONTEXT bytes, targets the next byte of each."""
    data = np.frombuffer(CORPUS.read_bytes(), dtype=np.uint8).astype("int64")
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(data) - CONTEXT - 1, size=BATCH)
        window = np.stack([data[s:s + CONTEXT + 1] for s in starts])
        yield paddle.to_tensor(window[:, :-1]), paddle.to_tensor(window[:, 1:])


def loss(logits: paddle.Tensor, targets: paddle.Tensor) -> paddle.Tensor:
    return F.cross_entropy(logits.reshape([-1, VOCAB]), targets.reshape([-1]))
