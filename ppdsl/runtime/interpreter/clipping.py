"""Clipping by the global norm of the whole model's gradients, over the pipeline's ranks.

Each rank sums the squares of its stages' gradients (in float64), every rank hands in its
sum, and the norm is the square root of the sum over one replica's pipeline ranks (after a
step the replicas hold the same averaged gradients); with sharded stages, over the shards of
one copy of the pipeline, each summing its own shard. Every gradient is then scaled by
`max_norm / (norm + 1e-6)` when that is below 1, as `torch.nn.utils.clip_grad_norm_` and
Paddle's `ClipGradByGlobalNorm` do.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any

from ..framework import Framework

EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s


def check_max_norm(max_norm: float) -> float:
    if not (isinstance(max_norm, (int, float)) and math.isfinite(max_norm) and max_norm > 0):
        raise ValueError(f"max_norm must be a finite number above 0 (got {max_norm!r})")
    return float(max_norm)


def _grads(fw: Framework, layers: Iterable[Any], skip: Collection[int] = ()) -> Iterator[Any]:
    """Every gradient the layers' parameters hold (but those of the parameters whose id is in `skip`)."""
    for layer in layers:
        for _, p in fw.named_parameters(layer):
            if id(p) in skip:
                continue
            g = fw.grad_of(p)
            if g is not None:
                yield g


def square_sum(fw: Framework, layers: Iterable[Any], skip: Collection[int] = (), whole_too: bool = True) -> float:
    """The sum of the squares of every gradient the layers' parameters hold, in float64 (a
    parameter in `skip`, a tied copy, counts once: on its tie's lowest stage). A gradient
    split over tensor-parallel ranks counts its part here; one every tensor rank holds whole
    counts only where `whole_too` (on tensor rank 0)."""
    total = 0.0
    for g in _grads(fw, layers, skip):
        if not whole_too and not fw.is_split(g):
            continue
        a = fw.to_numpy(fw.local(g)).astype("float64")
        total += float((a * a).sum())
    return total


def all_finite(fw: Framework, layers: Iterable[Any], gather: Callable[[Any], list[Any]],
               losses: Iterable[float] = ()) -> bool:
    """Whether every rank's gradients and the losses each rank gives are finite (a collective:
    every rank calls it)."""
    bad = any(not math.isfinite(v) for v in losses)
    return all(math.isfinite(v) for v in gather(math.inf if bad else square_sum(fw, layers)))


def clip_grad_norm(fw: Framework, layers: Iterable[Any], max_norm: float,
                   gather: Callable[[Any], list[Any]], pipeline: int, skip: Collection[int] = (),
                   whole_too: bool = True) -> float:
    """Clip the gradients of `layers` (this rank's stages) by the global norm; the norm, taken
    before clipping. Every rank of the job calls it (`gather` is a collective); the first
    `pipeline` ranks hold the whole model once (one copy's pipeline ranks, with their shards).
    A non-finite norm is returned and nothing is scaled: skip that step's optimizer."""
    layers = list(layers)
    norm = math.sqrt(sum(gather(square_sum(fw, layers, skip, whole_too))[:pipeline]))
    if math.isfinite(norm):
        coef = max_norm / (norm + EPS)
        if coef < 1.0:
            for g in _grads(fw, layers):
                local = fw.local(g)
                fw.unflatten_into(fw.flatten([local]), [local], coef)
    return norm
