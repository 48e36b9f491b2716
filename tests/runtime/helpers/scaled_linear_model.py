"""The built-in MLP with a Linear subclass that has its own forward: the split backward cannot
defer its weight gradient, warns once naming it, and computes it in I (still exact)."""

from __future__ import annotations

import paddle

from ppdsl.runtime.jobs import models


class ScaledLinear(paddle.nn.Linear):
    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return super().forward(x) * 0.5


def build_stage(stage: int, stages: int) -> paddle.nn.Layer:
    layer = models.build_stage(stage, stages)
    saved = paddle.get_default_dtype()
    paddle.set_default_dtype(models.DTYPE)
    try:
        scaled = ScaledLinear(models.WIDTH, models.WIDTH)
    finally:
        paddle.set_default_dtype(saved)
    return paddle.nn.Sequential(scaled, layer) if stage == 0 else layer
