"""The small classifier of examples/my_model.py in PyTorch, for `ppdsl run --framework torch`.

    ppdsl run schedules/1f1b.pps --framework torch --model examples/torch/my_model.py:build_stage \
        --data examples/torch/my_model.py:batches --loss examples/torch/my_model.py:loss --steps 20 --optimizer adam --lr 1e-3

The contract (docs/runtime.md): `build_stage(stage_index, num_stages)` returns the module of
one stage (here one tensor in, one out; a stage may also pass a tuple or dict, see
examples/torch/gpt/model.py); `batches()` yields whole (inputs, targets) batches
that split evenly into the schedule's microbatches; `loss(output, target)` returns a scalar.
The same sizes, cut and data as the Paddle example.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

FEATURES, HIDDEN, CLASSES = 16, 64, 4
BLOCKS = 8  # hidden blocks, shared out among the stages
BATCH = 64


def build_stage(stage_index: int, num_stages: int) -> torch.nn.Module:
    if num_stages > BLOCKS:
        raise ValueError(f"this model has {BLOCKS} blocks and cannot be cut into {num_stages} stages")
    first = stage_index * BLOCKS // num_stages
    last = (stage_index + 1) * BLOCKS // num_stages
    layers: list[torch.nn.Module] = []
    if stage_index == 0:
        layers.append(torch.nn.Linear(FEATURES, HIDDEN))
    for _ in range(first, last):
        layers += [torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU()]
    if stage_index == num_stages - 1:
        layers.append(torch.nn.Linear(HIDDEN, CLASSES))
    return torch.nn.Sequential(*layers)


def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Points labelled by which of four fixed centres is nearest: learnable, deterministic."""
    rng = np.random.default_rng(1234)
    centres = rng.standard_normal((CLASSES, FEATURES)).astype("float32")
    while True:
        x = rng.standard_normal((BATCH, FEATURES)).astype("float32")
        labels = np.argmin(((x[:, None, :] - centres[None]) ** 2).sum(-1), axis=1).astype("int64")
        yield torch.from_numpy(x), torch.from_numpy(labels)


def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(output, target)
