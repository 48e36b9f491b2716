"""Models that fail on purpose, for the runtime's fault tests (PPDSL_FAULT: see fault.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import paddle

from ppdsl.runtime.jobs import models

sys.path.insert(0, str(Path(__file__).parent))
from fault import Trigger  # noqa: E402


class Faulty(paddle.nn.Layer):
    def __init__(self, inner: paddle.nn.Layer, stage: int):
        super().__init__()
        self.inner = inner
        self.trigger = Trigger(stage)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        self.trigger()
        return self.inner(x)


def build_stage(stage: int, stages: int) -> paddle.nn.Layer:
    return Faulty(models.build_stage(stage, stages), stage)


def not_a_layer(stage: int, stages: int) -> object:
    return {"stage": stage}


def vector_loss(output: paddle.Tensor, target: paddle.Tensor) -> paddle.Tensor:
    return (output - target) ** 2
