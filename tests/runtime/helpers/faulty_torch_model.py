"""The fault tests' model on torch (PPDSL_FAULT: see fault.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from ppdsl.runtime.jobs import models

sys.path.insert(0, str(Path(__file__).parent))
from fault import Trigger  # noqa: E402


class Faulty(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module, stage: int):
        super().__init__()
        self.inner = inner
        self.trigger = Trigger(stage)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.trigger()
        return self.inner(x)  # type: ignore[no-any-return]


def build_stage(stage: int, stages: int) -> torch.nn.Module:
    return Faulty(models.build_stage(stage, stages, framework="torch"), stage)
