"""The built-in model on torch behind a Linear subclass with its own forward and a Conv1d:
weights outside the split matmul. The graph split defers the subclass's weight to W (its
backward is a matrix product, a fork that costs nothing twice) and keeps the convolution's in I."""

from __future__ import annotations

import torch

from ppdsl.runtime.jobs import models


class ScaledLinear(torch.nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 0.5


class Front(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module, width: int):
        super().__init__()
        self.scaled = ScaledLinear(width, width, dtype=torch.float64)
        self.conv = torch.nn.Conv1d(1, 2, 3, padding=1, dtype=torch.float64)
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mixed = self.conv(x.unsqueeze(1)).sum(1)  # [batch, width] -> [batch, 2, width] -> [batch, width]
        return self.inner(x + torch.tanh(self.scaled(x) + mixed))  # type: ignore[no-any-return]


def build_stage(stage: int, stages: int) -> torch.nn.Module:
    torch.manual_seed(stage)
    inner = models.build_stage(stage, stages, framework="torch")
    width = next(p for p in inner.parameters() if p.dim() == 2).shape[1]
    return Front(inner, width)
