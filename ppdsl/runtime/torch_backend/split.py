"""PyTorch's split backward: a switched `torch.nn.Linear` computes through an `autograd.Function`
whose backward returns the input and bias gradients and leaves the weight gradient to `W`
(`split_backward.py`). Each product is the one autograd's own Linear backward computes
(`dy @ weight`, `dy^T @ x`, `dy.sum(0)`), in the dtype the forward ran in, accumulated into the
parameter as autograd accumulates."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch

from ..interpreter import split_backward
from ..interpreter.split_backward import DeferredGrads


def _rows(t: Any) -> Any:
    """[..., n] -> [rows, n]: the weight gradient of a matmul over any leading dimensions."""
    return t.reshape(-1, t.shape[-1]) if t.dim() > 2 else t


# One C call that says whether autocast is on for any device: the split Linear runs on every
# Linear of every microbatch, and asking per device builds a device object each time.
_any_autocast: Callable[[], bool] = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)


def autocast_dtype(device_type: str) -> Any:
    """The dtype autocast gives a Linear on `device_type` now, or None when it is off (callers
    on the hot path ask `_any_autocast()` first: it costs less than naming a device)."""
    try:
        enabled = torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4 asks per device kind
        enabled = torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled()
    if not enabled:
        return None
    try:
        return torch.get_autocast_dtype(device_type)
    except AttributeError:  # torch < 2.4
        return torch.get_autocast_cpu_dtype() if device_type == "cpu" else torch.get_autocast_gpu_dtype()


def _autocast_off(device_type: str) -> AbstractContextManager[Any]:
    """Products taken in the dtypes of their operands, as autograd's backward takes them."""
    off: AbstractContextManager[Any] = torch.autocast(device_type, enabled=False)
    return off


def _would_recast(t: Any) -> bool:
    """Autocast is on and would cast `t` (its dtype is not autocast's): a product of it must be
    taken with autocast off. Entering that context costs more than the check, so only then."""
    if not _any_autocast():
        return False
    dtype = autocast_dtype(t.device.type)
    return dtype is not None and t.dtype != dtype and t.dtype != torch.float64 and t.is_floating_point()


def _cast(t: Any, dtype: Any) -> Any:
    """Autocast's rule for a lower-precision op: floating tensors but float64 take its dtype."""
    if t is None or not t.is_floating_point() or t.dtype == torch.float64 or t.dtype == dtype:
        return t
    return t.to(dtype)


def accumulate_weight_grad(weight: Any, x: Any, dy: Any) -> None:
    if not weight.requires_grad:
        return
    if _would_recast(x) or _would_recast(dy):
        with _autocast_off(x.device.type):
            _accumulate(weight, x, dy)
    else:
        _accumulate(weight, x, dy)


def _accumulate(weight: Any, x: Any, dy: Any) -> None:
    with torch.no_grad():
        product = _rows(dy).t().mm(_rows(x))
        if product.dtype != weight.dtype:  # autocast's cast node hands the gradient back so
            product = product.to(weight.dtype)
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
            dtype = autocast_dtype(x.device.type) if _any_autocast() else None
            if dtype is not None:  # what autocast would do to F.linear's operands (it leaves them so)
                x, weight_used, bias = _cast(x, dtype), _cast(weight, dtype), _cast(bias, dtype)
                y = torch.nn.functional.linear(x, weight_used, bias)
            else:
                weight_used = weight
                y = torch.nn.functional.linear(x, weight, bias)
            ctx.save_for_backward(x, weight_used)
            # The parameter itself: a checkpoint's recomputation saves a detached weight.
            ctx.weight = weight
            ctx.store = store
            ctx.has_bias = bias is not None
            store.forwarded()
            return y

        @staticmethod
        def backward(ctx: Any, dy: Any) -> Any:
            x, weight = ctx.saved_tensors
            ctx.store.defer(ctx.weight, x, dy)
            if _would_recast(dy) or _would_recast(weight):
                with _autocast_off(dy.device.type):
                    return _input_and_bias_grads(ctx, dy, weight)
            return _input_and_bias_grads(ctx, dy, weight)

    return SplitLinear


def _input_and_bias_grads(ctx: Any, dy: Any, weight: Any) -> tuple[Any, None, Any, None]:
    needs = ctx.needs_input_grad
    dx = (dy.mm(weight) if dy.dim() == 2 else dy.matmul(weight)) if needs[0] else None  # autograd casts dx
    db = _rows(dy).sum(0) if ctx.has_bias and needs[2] else None
    return dx, None, db, None


def split_forward(layer: Any, store: DeferredGrads) -> Any:
    """The forward of a switched `torch.nn.Linear`: the split matmul where its weight is a
    parameter that takes a gradient, the plain Linear otherwise."""
    apply = _split_linear().apply
    linear = torch.nn.functional.linear
    grad_enabled = torch.is_grad_enabled
    # Read at each call, as Linear.forward reads them (a wrapper may swap them between calls),
    # from the dict itself: Module.__getattr__ costs more than the rest of this check.
    parameters = layer._parameters

    def forward(x: Any) -> Any:
        weight = parameters["weight"]
        if weight.requires_grad and weight.is_leaf and grad_enabled():
            return apply(x, weight, parameters["bias"], store)
        return linear(x, weight, parameters["bias"])

    return forward


def unsplittable(stage: Any, name: str, layer: Any) -> str:
    """Why `layer` (named `name` inside `stage`) must keep autograd's own backward, or ""."""
    weight = layer._parameters.get("weight")
    if not isinstance(weight, torch.nn.Parameter):
        return "has a computed weight (a parametrization), so its weight gradient comes with the input gradient in I"
    ancestors = _ancestors(stage, name)
    fsdp2 = [m for m in ancestors if _is_fsdp2(m)]
    if fsdp2:
        # The schedule drives FSDP2 (`fsdp.ShardedStage`): its gradient sync waits for the
        # stage's REDUCE_GRAD, after every W, and W adds into the gathered weight's gradient.
        # With a reduce dtype other than the parameters', FSDP upcasts the gradient once per
        # backward: W's added between two would be summed in the lower precision.
        mp = fsdp2[-1]._get_fsdp_state()._mp_policy
        if mp.param_dtype is not None and mp.reduce_dtype not in (None, mp.param_dtype):
            return (f"is inside an FSDP module with mixed precision (param_dtype {mp.param_dtype}, reduce_dtype "
                    f"{mp.reduce_dtype}), which upcasts gradients at each backward: it is computed in I")
        return ""
    if _is_dtensor(weight):
        return ("has a DTensor weight (tensor parallelism), whose gradient is reduced when I ends: "
                "it is computed in I")
    if any(_is_fsdp(m) for m in ancestors):
        return "is inside an FSDP module, which reduces its gradient when I ends: it is computed in I"
    return ""


def graph_weights(stage: Any, switched: Sequence[Any]) -> list[tuple[str, Any, str]]:
    """The weights of `stage` the autograd graph defers (`graph_split.py`): every parameter of
    two or more dimensions that is not a split Linear's, a DTensor, or under FSDP (those must be
    whole when `I` ends), nor a small embedding table (`EMBEDDING_MIN`). A one-dimensional
    parameter (a norm's scale, a bias) stays in `I`: its gradient is one reduction, cheaper
    than a second call of the node that makes it."""
    taken = {id(p) for layer in switched for p in layer.parameters(recurse=False)}
    out = []
    embeddings = (torch.nn.Embedding, torch.nn.EmbeddingBag)
    for module_name, module in stage.named_modules():
        for name, p in module.named_parameters(recurse=False):
            if id(p) in taken or not p.requires_grad or p.dim() < 2 or _is_dtensor(p):
                continue
            if isinstance(module, embeddings) and p.numel() < split_backward.EMBEDDING_MIN:
                continue
            taken.add(id(p))
            if any(_is_fsdp(m) for m in _ancestors(stage, module_name)):
                continue
            out.append((f"{module_name}.{name}" if module_name else name, p, type(module).__name__))
    return out


def _ancestors(stage: Any, name: str) -> list[Any]:
    out = [stage]
    parts = name.split(".") if name else []
    module = stage
    for part in parts:
        module = getattr(module, part)
        out.append(module)
    return out


def _is_dtensor(t: Any) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch built without distributed
        return False
    return isinstance(t, DTensor) or isinstance(getattr(t, "data", None), DTensor)


def _is_fsdp2(module: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def _is_fsdp(module: Any) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    except ImportError:  # pragma: no cover - torch < 2.6 or without distributed
        return False
    return isinstance(module, (FSDPModule, FullyShardedDataParallel))
