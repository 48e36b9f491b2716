"""A user model for `ppdsl run --model/--data/--loss`: a small classifier cut into stages.

    ppdsl run schedules/1f1b.pps --model examples/my_model.py:build_stage \
        --data examples/my_model.py:batches --loss examples/my_model.py:loss --steps 20 --optimizer adam --lr 1e-3

The contract (docs/runtime.md): `build_stage(stage_index, num_stages)` returns the layer of
one stage (here one tensor in, one out; a stage may also pass a tuple or dict, see
examples/gpt/model.py); `batches()` yields whole (inputs, targets) batches
that split evenly into the schedule's microbatches; `loss(output, target)` returns a scalar.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import paddle

FEATURES, HIDDEN, CLASSES = 16, 64, 4
BLOCKS = 8  # hidden blocks, shared out among the stages
BATCH = 64


def build_stage(stage_index: int, num_stages: int) -> paddle.nn.Layer:
    if num_stages > BLOCKS:
        raise ValueError(f"this model has {BLOCKS} blocks and cannot be cut into {num_stages} stages")
    first = stage_index * BLOCKS // num_stages
    last = (stage_index + 1) * BLOCKS // num_stages
    layers: list[paddle.nn.Layer] = []
    if stage_index == 0:
        layers.append(paddle.nn.Linear(FEATURES, HIDDEN))
    for _ in range(first, last):
        layers += [paddle.nn.Linear(HIDDEN, HIDDEN), paddle.nn.ReLU()]
    if stage_index == num_stages - 1:
        layers.append(paddle.nn.Linear(HIDDEN, CLASSES))
    return paddle.nn.Sequential(*layers)


def batches() -> Iterator[tuple[paddle.Tensor, paddle.Tensor]]:
    """Points labelled by which of four fixed centres is nearest: learnable, deterministic."""
    rng = np.random.default_rng(1234)
    centres = rng.standard_normal((CLASSES, FEATURES)).astype("float32")
    while True:
        x = rng.standard_normal((BATCH, FEATURES)).astype("float32")
        labels = np.argmin(((x[:, None, :] - centres[None]) ** 2).sum(-1), axis=1).astype("int64")
        yield paddle.to_tensor(x), paddle.to_tensor(labels)


def loss(output: paddle.Tensor, target: paddle.Tensor) -> paddle.Tensor:
    return paddle.nn.functional.cross_entropy(output, target)
