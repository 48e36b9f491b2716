"""A Paddle model whose first stage holds an embedding table of 2**20 elements, which the split
backward defers to W through its split embedding: token ids in, a regression target out."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import paddle

VOCAB, WIDTH, TOKENS, BATCH = 16384, 64, 4, 8


def build_stage(stage_index: int, num_stages: int) -> paddle.nn.Layer:
    paddle.seed(stage_index)
    saved = paddle.get_default_dtype()
    paddle.set_default_dtype("float64")
    try:
        layers: list[paddle.nn.Layer] = [paddle.nn.Embedding(VOCAB, WIDTH, padding_idx=0)] if stage_index == 0 else []
        layers += [paddle.nn.Linear(WIDTH, WIDTH), paddle.nn.Tanh()]
        return paddle.nn.Sequential(*layers)
    finally:
        paddle.set_default_dtype(saved)


def batches() -> Iterator[tuple[paddle.Tensor, paddle.Tensor]]:
    rng = np.random.default_rng(0)
    while True:
        ids = rng.integers(0, 40, (BATCH, TOKENS))  # few ids: repeats, and the padding id 0
        yield paddle.to_tensor(ids), paddle.to_tensor(rng.standard_normal((BATCH, TOKENS, WIDTH)))


def loss(output: paddle.Tensor, target: paddle.Tensor) -> paddle.Tensor:
    return ((output - target) ** 2).mean()
