"""Models that fail on purpose, for the runtime's fault tests.

PPDSL_FAULT=MODE:STAGE:CALL makes stage STAGE misbehave on its CALL-th forward (0-based):
`raise` raises, `kill` SIGKILLs its own process, `hang` sleeps (a compute that never ends,
so the peers' waits must time out).
"""

from __future__ import annotations

import os
import signal
import time

import paddle

from ppdsl.runtime import models


class Faulty(paddle.nn.Layer):
    def __init__(self, inner: paddle.nn.Layer, stage: int):
        super().__init__()
        self.inner = inner
        self.stage = stage
        self.calls = 0
        mode, at_stage, at_call = (os.environ.get("PPDSL_FAULT", "none:-1:-1").split(":") + ["-1", "-1"])[:3]
        self.mode, self.at_stage, self.at_call = mode, int(at_stage), int(at_call)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        if self.stage == self.at_stage and self.calls == self.at_call:
            if self.mode == "raise":
                raise ValueError("boom in the model")
            if self.mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.mode == "hang":
                time.sleep(3600)
        self.calls += 1
        return self.inner(x)


def build_stage(stage: int, stages: int) -> paddle.nn.Layer:
    return Faulty(models.build_stage(stage, stages), stage)


def not_a_layer(stage: int, stages: int) -> object:
    return {"stage": stage}


def vector_loss(output: paddle.Tensor, target: paddle.Tensor) -> paddle.Tensor:
    return (output - target) ** 2
