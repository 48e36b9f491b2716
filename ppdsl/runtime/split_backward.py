"""A backward split in two without doing any work twice: `I` now, the weight gradients at `W`.

Every `paddle.nn.Linear` of a stage is switched to a `PyLayer` matmul. Its backward returns the
input gradient (and the bias gradient) at once and, instead of computing the weight gradient,
leaves the two tensors that make it (the layer's input and the gradient of its output) in a
`DeferredGrads` store under the (stage, microbatch) the interpreter is running. `W(s,m)` later
runs exactly that key's weight gradients (`weight.grad += x^T @ dy`, one GEMM into the gradient
where `blas.py` can) and drops the tensors.

So `I(s,m)` is one ordinary backward over the stage (it frees the graph) that also yields the
gradients of parameters that are not deferred (biases, norms, embeddings); `W(s,m)` is the
matmuls the backward left out. With no key set (a fused `B`, or autograd outside a schedule)
the weight gradient is computed on the spot, so a switched layer always gives the gradient
an unswitched one would (to float rounding): the parameters and the state dict do not change.

Paddle's own zero-bubble code (`fleet/meta_parallel/zero_bubble_utils.py`) keeps one global
queue of closures popped in order; a schedule's `W`s need not come in the order of its `I`s
and several stages share a process, hence the keyed store, one per `PipelineSchedule`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

from .blas import accumulate_product

Key = tuple[int, int]

_SWITCHED = "_ppdsl_split_backward"  # set on a Linear whose forward was switched


class DeferredGrads:
    """Weight gradients left by `I` actions, keyed by (stage, microbatch)."""

    def __init__(self) -> None:
        self.key: Key | None = None  # what the running backward defers under; None: compute now
        self._pending: dict[Key, list[tuple[Any, Any, Any]]] = {}

    def defer(self, weight: Any, x: Any, dy: Any) -> None:
        if self.key is None:
            accumulate_weight_grad(weight, x, dy)
        else:
            self._pending.setdefault(self.key, []).append((weight, x, dy))

    def run(self, key: Key) -> int:
        """The weight gradients deferred under `key`, then forget their tensors; how many ran."""
        work = self._pending.pop(key, ())
        for weight, x, dy in work:
            accumulate_weight_grad(weight, x, dy)
        return len(work)

    def holds(self, key: Key) -> bool:
        return key in self._pending

    def keys(self) -> Iterator[Key]:
        return iter(self._pending)

    def tensors(self) -> Iterator[Any]:
        """The tensors the deferred gradients keep alive (inputs and output gradients)."""
        for work in self._pending.values():
            for _, x, dy in work:
                yield x
                yield dy

    def clear(self) -> None:
        self._pending.clear()
        self.key = None


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


def _switched_forward(layer: Any, store: DeferredGrads) -> Any:
    matmul = _split_matmul()

    def forward(x: Any) -> Any:
        return matmul.apply(x, layer.weight, layer.bias, store)

    return forward


def switch_linears(stage: Any, store: DeferredGrads) -> tuple[list[str], list[str]]:
    """Switch every plain `paddle.nn.Linear` inside `stage` to the split backward.

    Returns (names switched, names left as they were). A subclass that overrides `forward`
    computes something the split matmul does not know: it keeps its own forward, and its
    weight gradient comes with the input gradient in `I` (correct, just not deferred).
    """
    import paddle

    switched: list[str] = []
    kept: list[str] = []
    for name, sub in stage.named_sublayers(include_self=True):
        if not isinstance(sub, paddle.nn.Linear):
            continue
        label = name or "(the stage itself)"
        if type(sub).forward is not paddle.nn.Linear.forward or ("forward" in vars(sub) and not getattr(sub, _SWITCHED, False)):
            kept.append(f"{label} ({type(sub).__name__})")
            continue
        object.__setattr__(sub, "forward", _switched_forward(sub, store))
        object.__setattr__(sub, _SWITCHED, True)
        switched.append(label)
    return switched, kept


def restore_linears(stage: Any) -> None:
    """Undo `switch_linears`: every switched Linear gets its class's forward back."""
    for _, sub in stage.named_sublayers(include_self=True):
        if getattr(sub, _SWITCHED, False):
            del sub.__dict__["forward"]
            object.__setattr__(sub, _SWITCHED, False)
