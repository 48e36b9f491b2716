"""PyTorch's split backward: every `torch.nn.Linear` switched to an `autograd.Function` whose
backward returns the input and bias gradients and leaves the weight gradient to `W`
(`split_backward.py`). Each product is the one autograd's own Linear backward computes
(`dy @ weight`, `dy^T @ x`, `dy.sum(0)`), accumulated as autograd accumulates, so the
gradients equal an unsplit backward's bit for bit."""

from __future__ import annotations

import functools
from typing import Any

import torch

from ..split_backward import DeferredGrads

def _rows(t: Any) -> Any:
    """[..., n] -> [rows, n]: the weight gradient of a matmul over any leading dimensions."""
    return t.reshape(-1, t.shape[-1]) if t.dim() > 2 else t


def accumulate_weight_grad(weight: Any, x: Any, dy: Any) -> None:
    if not weight.requires_grad:
        return
    with torch.no_grad():
        product = _rows(dy).t().mm(_rows(x))
        if weight.grad is None:
            weight.grad = product
        else:
            weight.grad.add_(product)


@functools.cache
def _split_linear() -> Any:
    base: Any = torch.autograd.Function

    class SplitLinear(base):  # type: ignore[misc]  # subclassing Any: torch's Function is generic
        @staticmethod
        def forward(ctx: Any, x: Any, weight: Any, bias: Any, store: DeferredGrads) -> Any:
            ctx.save_for_backward(x, weight)
            ctx.store = store
            ctx.has_bias = bias is not None
            return torch.nn.functional.linear(x, weight, bias)

        @staticmethod
        def backward(ctx: Any, dy: Any) -> Any:
            x, weight = ctx.saved_tensors
            ctx.store.defer(weight, x, dy)
            dx = None
            if ctx.needs_input_grad[0]:
                dx = dy.mm(weight) if dy.dim() == 2 else dy.matmul(weight)
            db = _rows(dy).sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
            return dx, None, db, None

    return SplitLinear


def split_forward(layer: Any, store: DeferredGrads) -> Any:
    """The forward of a switched `torch.nn.Linear`."""
    function = _split_linear()

    def forward(x: Any) -> Any:
        return function.apply(x, layer.weight, layer.bias, store)

    return forward
