"""Stages split over tensor-parallel ranks (`torch.distributed.tensor.parallel`).

The job's mesh is replicas x pipeline ranks x tensor ranks (global rank = (replica * P +
pipeline rank) * T + tensor rank, `process_layout.Layout`); each stage is split over its "tp"
dimension by a plan: the built-in model's (`mlp_plan`) or the user model's own `parallelize`.
A stage's output may be a plain tensor (torch's `use_local_output`, the default of its
styles) or a DTensor, whose local part the pipeline's messages carry and the receiving rank
rebuilds over its own stage's mesh (`transport/wire.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def job_mesh(replicas: int, pipeline: int, tensor: int) -> DeviceMesh:
    """The whole job's mesh (every process calls it at the same point: it makes groups over
    the whole world)."""
    device = "cuda" if torch.cuda.is_available() and torch.cuda.is_initialized() else "cpu"
    return init_device_mesh(device, (replicas, pipeline, tensor), mesh_dim_names=("dp", "pp", "tp"))


def mlp_plan(layer: torch.nn.Module, tensor: int) -> dict[str, Any]:
    """Megatron's plan for a stack of Linears with element-wise activations between them (the
    built-in model): each pair of consecutive Linears column-split then row-split, so that one
    all-reduce ends the pair; a Linear left over, or one whose width does not split, stays whole."""
    linears = [(name, m) for name, m in layer.named_modules() if isinstance(m, torch.nn.Linear)]
    plan: dict[str, Any] = {}
    i = 0
    while i + 1 < len(linears):
        (a, first), (b, second) = linears[i], linears[i + 1]
        if first.out_features == second.in_features and first.out_features % tensor == 0:
            plan[a], plan[b] = ColwiseParallel(), RowwiseParallel()
            i += 2
        else:
            i += 1
    return plan


def split_layers(layers: dict[int, Any], replicas: int, pipeline: int, tensor: int,
                 parallelize: Callable[[Any, Any], None] | None) -> None:
    """Split each stage layer over its tensor-parallel ranks: with `parallelize(layer, mesh)`
    (the user's plan, given the "tp" mesh), else with `mlp_plan`."""
    mesh = job_mesh(replicas, pipeline, tensor)["tp"]
    for layer in layers.values():
        if parallelize is not None:
            parallelize(layer, mesh)
        else:
            parallelize_module(layer, mesh, mlp_plan(layer, tensor))
