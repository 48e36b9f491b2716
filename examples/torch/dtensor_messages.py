"""A model whose stages send DTensors (`ppdsl run --tp 2 --model ...`): each stage's MLP ends in
a row-split Linear that reduce-scatters its output over the batch rows and keeps it a DTensor
(`output_layouts=Shard(0), use_local_output=False`), so each tensor rank sends only its rows,
and the next stage's column-split Linear takes that DTensor as it is (`input_layouts=Shard(0)`)
and gathers the rows. The last stage's output is whole and plain, for the loss."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

WIDTH = 8
BATCH = 16  # 4 microbatches of 4 rows: 2 rows per tensor rank


class Stage(nn.Module):
    def __init__(self, first: bool, last: bool) -> None:
        super().__init__()
        self.first, self.last = first, last
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.tanh(self.up(x)))


def build_stage(stage_index: int, num_stages: int) -> nn.Module:
    torch.manual_seed(stage_index)
    return Stage(stage_index == 0, stage_index == num_stages - 1).double()


def parallelize(stage: Stage, mesh: object) -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    parallelize_module(stage, mesh, {  # type: ignore[arg-type]
        "up": ColwiseParallel(input_layouts=Replicate() if stage.first else Shard(0)),
        "down": RowwiseParallel() if stage.last else RowwiseParallel(output_layouts=Shard(0), use_local_output=False),
    })


def batches(seed: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    while True:
        yield (torch.randn(BATCH, WIDTH, generator=g, dtype=torch.float64),
               torch.randn(BATCH, WIDTH, generator=g, dtype=torch.float64))


def loss(y: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return ((y - t) ** 2).mean()
