"""Paddle's split backward: a switched `paddle.nn.Linear` computes through a `PyLayer` matmul whose
backward defers the weight gradient to a `DeferredGrads` store (`split_backward.py`), to be
accumulated into the layer's parameter itself. A large `paddle.nn.Embedding` the same way: its
backward defers the scatter of the output gradient into the table."""

from __future__ import annotations

import functools
from typing import Any

from ..interpreter import split_backward
from ..interpreter.split_backward import DeferredGrads
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
            # The parameter itself: a recompute's second forward saves a detached weight.
            ctx.weight = weight
            ctx.store = store
            store.forwarded()
            # Read now: the tensors a recompute hands back are new ones with stop_gradient set.
            ctx.input_grad = not x.stop_gradient
            ctx.has_bias = bias is not None
            ctx.bias_grad = bias is not None and not bias.stop_gradient
            return paddle.nn.functional.linear(x, weight, bias)

        @staticmethod
        def backward(ctx: Any, dy: Any) -> Any:
            x, weight = ctx.saved_tensor()
            ctx.store.defer(ctx.weight, x, dy)
            dx = paddle.matmul(dy, weight, transpose_y=True) if ctx.input_grad else None
            if not ctx.has_bias:
                return dx, None
            return dx, None, paddle.sum(_rows(dy), axis=0) if ctx.bias_grad else None

    return SplitMatmul


def accumulate_embedding_grad(padding_idx: int | None) -> Any:
    """What adds an embedding's weight gradient: each row of `dy` into the row of the table its
    id names, but the padding id's (Paddle's embedding gradient, in the order it adds)."""
    def accumulate(weight: Any, ids: Any, dy: Any) -> None:
        paddle = _paddle()
        if weight.stop_gradient:
            return
        with paddle.no_grad():
            flat = ids.reshape([-1])
            rows = dy.reshape([-1, dy.shape[-1]])
            if padding_idx is not None:
                rows = rows * (flat != padding_idx).astype(rows.dtype).unsqueeze(-1)
            grad = weight.grad
            if grad is None:
                weight.grad = paddle.index_add(paddle.zeros_like(weight), flat, 0, rows)
            else:
                grad.index_add_(flat, 0, rows)

    return accumulate


@functools.cache
def _split_embedding() -> Any:
    paddle = _paddle()
    base: Any = paddle.autograd.PyLayer

    class SplitEmbedding(base):  # type: ignore[misc]  # subclassing Any: paddle is untyped
        @staticmethod
        def forward(ctx: Any, ids: Any, weight: Any, padding_idx: int | None, store: DeferredGrads) -> Any:
            ctx.save_for_backward(ids)
            ctx.weight = weight  # the parameter itself (a recompute saves a detached one)
            ctx.store = store
            ctx.accumulate = accumulate_embedding_grad(padding_idx)
            store.forwarded()
            return paddle.nn.functional.embedding(ids, weight, padding_idx=padding_idx)

        @staticmethod
        def backward(ctx: Any, dy: Any) -> Any:
            (ids,) = ctx.saved_tensor()
            ctx.store.defer(ctx.weight, ids, dy, ctx.accumulate)
            return None, None

    return SplitEmbedding


def embeddings(stage: Any) -> list[tuple[str, Any]]:
    """The embeddings of `stage` a split layer takes: a plain `paddle.nn.Embedding` (its own
    forward, dense gradient, no `max_norm` or frequency scaling) whose table has at least
    `EMBEDDING_MIN` elements and is a parameter."""
    paddle = _paddle()
    out = []
    for name, sub in stage.named_sublayers(include_self=True):
        if type(sub).forward is not paddle.nn.Embedding.forward or "forward" in vars(sub):
            continue
        weight = sub._parameters.get("weight")
        if (not isinstance(weight, paddle.base.framework.EagerParamBase) or weight.stop_gradient
                or sub._sparse or sub._max_norm is not None or sub._scale_grad_by_freq
                or int(weight.numel()) < split_backward.EMBEDDING_MIN):
            continue
        out.append((name or "(the stage itself)", sub))
    return out


def split_forward(layer: Any, store: DeferredGrads) -> Any:
    """The forward of a switched `paddle.nn.Linear` or `paddle.nn.Embedding`."""
    paddle = _paddle()
    takes_split = _takes_split()
    if isinstance(layer, paddle.nn.Embedding):
        embedding = _split_embedding()

        def forward_embedding(x: Any) -> Any:
            weight = layer.weight
            if takes_split(weight):
                return embedding.apply(x, weight, layer._padding_idx, store)
            return paddle.nn.Embedding.forward(layer, x)

        return forward_embedding
    matmul = _split_matmul()
    linear = paddle.nn.functional.linear

    def forward(x: Any) -> Any:
        weight = layer.weight
        if takes_split(weight):
            return matmul.apply(x, weight, layer.bias, store)
        return linear(x, weight, layer.bias)

    return forward


@functools.cache
def _takes_split() -> Any:
    """What says whether a call with `weight` runs the split layer: a leaf parameter that takes a
    gradient, under autograd, without amp (Paddle casts a layer's operands under amp, which the
    PyLayer would not; the CPU build ignores amp, so that path has not been measured on a GPU)."""
    paddle = _paddle()
    from paddle.base import core, framework

    tracer, amp_off, grad_enabled = framework._dygraph_tracer, core.AmpLevel.O0, paddle.is_grad_enabled

    def takes(weight: Any) -> bool:
        return bool(not weight.stop_gradient and weight.is_leaf and grad_enabled() and tracer()._amp_level == amp_off)

    return takes


def unsplittable(stage: Any, name: str, layer: Any) -> str:
    """Why `layer` must keep Paddle's own backward, or ""."""
    if not isinstance(layer._parameters.get("weight"), _paddle().base.framework.EagerParamBase):
        return "has a computed weight, so its weight gradient comes with the input gradient in I"
    return ""
