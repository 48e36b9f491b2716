"""Paddle's split backward: every `paddle.nn.Linear` switched to a `PyLayer` matmul whose
backward defers the weight gradient to a `DeferredGrads` store (`split_backward.py`)."""

from __future__ import annotations

import functools
from typing import Any

from ..split_backward import DeferredGrads
from .blas import accumulate_product

def _rows(t: Any) -> Any:
    """[..., n] -> [rows, n]: the weight gradient of a matmul over any leading dimensions."""
    return t.reshape([-1, t.shape[-1]]) if t.ndim > 2 else t


def _paddle() -> Any:
    import paddle

    return paddle


def accumulate_weight_grad(weight: Any, x: Any, dy: Any) -> None:
    paddle = _paddle()
    if weight.stop_gradient:
        return
    with paddle.no_grad():
        x, dy = _rows(x), _rows(dy)
        grad = weight.grad
        if grad is None:
            weight.grad = paddle.matmul(x, dy, transpose_x=True)
        elif not accumulate_product(grad, x, dy):
            # In place, as autograd accumulates: assigning `weight.grad` copies the whole
            # tensor (measured ~14x an add).
            grad.add_(paddle.matmul(x, dy, transpose_x=True))


@functools.cache
def _split_matmul() -> Any:
    """The PyLayer class, made once on first use (paddle is imported lazily)."""
    paddle = _paddle()
    base: Any = paddle.autograd.PyLayer

    class SplitMatmul(base):  # type: ignore[misc]  # subclassing Any: paddle is untyped
        @staticmethod
        def forward(ctx: Any, x: Any, weight: Any, bias: Any, store: DeferredGrads) -> Any:
            ctx.save_for_backward(x, weight)
            ctx.store = store
            ctx.has_bias = bias is not None
            ctx.bias_grad = bias is not None and not bias.stop_gradient
            return paddle.nn.functional.linear(x, weight, bias)

        @staticmethod
        def backward(ctx: Any, dy: Any) -> Any:
            x, weight = ctx.saved_tensor()
            ctx.store.defer(weight, x, dy)
            dx = None if x.stop_gradient else paddle.matmul(dy, weight, transpose_y=True)
            if not ctx.has_bias:
                return dx, None
            return dx, None, paddle.sum(_rows(dy), axis=0) if ctx.bias_grad else None

    return SplitMatmul


def split_forward(layer: Any, store: DeferredGrads) -> Any:
    """The forward of a switched `paddle.nn.Linear`."""
    matmul = _split_matmul()

    def forward(x: Any) -> Any:
        return matmul.apply(x, layer.weight, layer.bias, store)

    return forward
