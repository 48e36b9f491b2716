"""The user's own PyTorch model of `compat_matrix.py`: module-level classes, as a user's are, so
that a stage pickles (`torch.save(stage)`) like theirs."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

WIDTH, VOCAB = 8, 11


class Gain(torch.autograd.Function):
    """A user's own autograd Function with a weight: y = x * gain, per feature."""

    @staticmethod
    def forward(ctx: Any, x: Any, gain: Any) -> Any:
        ctx.save_for_backward(x, gain)
        return x * gain

    @staticmethod
    def backward(ctx: Any, dy: Any) -> Any:
        x, gain = ctx.saved_tensors
        return dy * gain, (dy * x).reshape(-1, x.shape[-1]).sum(0)


class Block(torch.nn.Module):
    """A user's block: a Linear in, a pre-norm MLP with a residual (checkpointed as `setting`
    says), a head on the last stage."""

    def __init__(self, last: bool, setting: str) -> None:
        super().__init__()
        self.setting = setting
        self.inp = torch.nn.Linear(WIDTH, WIDTH)
        self.mlp = torch.nn.Sequential(torch.nn.LayerNorm(WIDTH), torch.nn.Linear(WIDTH, 2 * WIDTH),
                                       torch.nn.GELU(), torch.nn.Linear(2 * WIDTH, WIDTH))
        self.head = torch.nn.Linear(WIDTH, WIDTH, bias=False) if last else None
        self.gain = torch.nn.Parameter(torch.linspace(0.5, 1.5, WIDTH)) if setting == "own_function" else None

    def forward(self, x: Any) -> Any:
        h = self.inp(x)
        if self.gain is not None:
            h = Gain.apply(h, self.gain)
        if self.setting == "checkpoint":
            h = h + checkpoint(self.mlp, h, use_reentrant=False)
        elif self.setting == "checkpoint_reentrant":
            h = h + checkpoint(self.mlp, h, use_reentrant=True)
        elif self.setting == "checkpoint_sequential":
            h = h + checkpoint_sequential(self.mlp, 2, h, use_reentrant=False)
        else:
            h = h + self.mlp(h)
        return self.head(h) if self.head is not None else h


class TokenConv(torch.nn.Module):
    """Token ids in at the first stage, a Conv1d over the sequence in every stage."""

    def __init__(self, first: bool) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH) if first else None
        self.conv = torch.nn.Conv1d(WIDTH, WIDTH, 3, padding=1)
        self.out = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: Any) -> Any:
        h = self.embed(x) if self.embed is not None else x
        h = self.conv(h.transpose(1, 2)).transpose(1, 2)
        return self.out(torch.tanh(h))
