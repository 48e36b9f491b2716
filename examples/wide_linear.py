"""A wide model where compute dominates: blocks of `paddle.nn.Linear(768)` + GELU, float32.

    ppdsl run schedules/zb1p.pps --model examples/wide_linear.py:build_stage \
        --data examples/wide_linear.py:batches --loss examples/wide_linear.py:loss --profile out.json

The model of `benchmarks/bench_split_backward.py` and of the simulator's accuracy check
(docs/runtime.md): each rank's share is `BLOCKS` blocks, cut evenly among the stages it holds
(a schedule with two stages per rank gives each one block). One batch is 1024 rows: 8
microbatches of 128 rows.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import paddle

WIDTH = int(os.environ.get("WIDE_LINEAR_WIDTH", "768"))
BLOCKS = 2  # per rank
ROWS = int(os.environ.get("WIDE_LINEAR_ROWS", "1024"))


def build_stage(stage_index: int, num_stages: int) -> paddle.nn.Layer:
    ranks = int(os.environ.get("PADDLE_TRAINERS_NUM", "2"))
    per_stage = max(1, BLOCKS * ranks // num_stages)
    layers: list[paddle.nn.Layer] = []
    for _ in range(per_stage):
        layers += [paddle.nn.Linear(WIDTH, WIDTH), paddle.nn.GELU()]
    return paddle.nn.Sequential(*layers)


def batches() -> Iterator[tuple[paddle.Tensor, paddle.Tensor]]:
    rng = np.random.default_rng(0)
    x = paddle.to_tensor(rng.standard_normal((ROWS, WIDTH)).astype("float32"))
    y = paddle.to_tensor(rng.standard_normal((ROWS, WIDTH)).astype("float32"))
    while True:
        yield x, y


def loss(output: paddle.Tensor, target: paddle.Tensor) -> paddle.Tensor:
    return paddle.nn.functional.mse_loss(output, target)
