"""A model whose stage 1 computes slightly differently on rank 1 than anywhere else, so the
pipeline (stage 1 on rank 1) and `--verify`'s unpipelined copy (on rank 0) disagree."""

from __future__ import annotations

import os

import paddle

from ppdsl.runtime.jobs import models


class Drift(paddle.nn.Layer):
    def __init__(self, inner: paddle.nn.Layer):
        super().__init__()
        self.inner = inner

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.inner(x) * 1.001


def build_stage(stage: int, stages: int) -> paddle.nn.Layer:
    layer = models.build_stage(stage, stages)
    if stage == 1 and os.environ.get("PADDLE_TRAINER_ID") == "1":
        return Drift(layer)
    return layer
