"""Stages sharded with FSDP2 (`torch.distributed.fsdp.fully_shard`), driven by the schedule.

`UNSHARD` starts the all-gather of every FSDP module of the stage (asynchronous: FSDP waits
for it in the stage's next forward or backward), `RESHARD` frees the gathered weights, and
`REDUCE_GRAD` reduce-scatters the gradients the step's backwards accumulated unsharded. The
step runs with FSDP's own gradient synchronisation off, as PyTorch's `_PipelineScheduleRuntime`
does, so that one reduce-scatter per step serves every microbatch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_param import ShardedState


class ShardedStage:
    """The FSDP modules of one stage layer (the layer first, when it is one)."""

    def __init__(self, layer: torch.nn.Module):
        self.layer = layer
        self.modules = [m for m in layer.modules() if isinstance(m, FSDPModule)]
        self.pending: list[Any] = []
        self.gathered = False

    def begin_step(self, resharded_by_schedule: bool) -> None:
        """Accumulate unsharded gradients until `reduce`; keep the gathered weights after a
        backward when the schedule frees them itself (its `RESHARD`)."""
        root = self.root
        root.set_requires_gradient_sync(False)
        root.set_is_last_backward(False)
        if resharded_by_schedule:
            root.set_reshard_after_backward(False)

    @property
    def root(self) -> Any:
        return self.layer

    def _params(self) -> list[Any]:
        """FSDP's record of each sharded parameter (`FSDPParam`)."""
        return [fp for m in self.modules for group in fully_shard.state(m)._fsdp_param_groups
                for fp in group.fsdp_params]

    def gathered_now(self) -> tuple[int, set[int]]:
        held, pointers = 0, set()
        for fp in self._params():
            if fp.sharded_state is ShardedState.UNSHARDED:
                whole = fp._unsharded_param
                held += whole.numel() * whole.element_size()
                pointers.add(whole.untyped_storage().data_ptr())
        return held, pointers

    def gather(self) -> None:
        if self.pending or self.gathered:
            return
        for m in self.modules:
            handle = m.unshard(async_op=True)
            if handle is not None:
                self.pending.append(handle)

    def wait(self) -> None:
        for handle in self.pending:
            handle.wait()
        self.pending.clear()
        self.gathered = True

    def free(self) -> None:
        self.wait()
        for m in self.modules:
            m.reshard()
        self.gathered = False

    def reduce(self) -> None:
        """The step's gradients, accumulated unsharded on this rank, reduce-scattered over the
        shard group (averaged: FSDP's default) and the gathered weights freed."""
        self.wait()
        root = self.root
        root.set_is_last_backward(True)
        root.set_reshard_after_backward(True)
        root.set_requires_gradient_sync(True)
        state = fully_shard.state(root)
        for inner in state._state_ctx.all_states:
            for group in inner._fsdp_param_groups:
                group.post_backward()
        # Waits for the reduce-scatters and hands the sharded gradients to the parameters.
        state._root_post_backward_final_callback()
        self.gathered = False


class PartlySharded(ValueError):
    """A stage layer with FSDP modules inside that is not one itself."""


def sharded_stage(layer: Any) -> ShardedStage | None:
    """The sharding of a stage layer wrapped with `fully_shard` (None: no FSDP module in it).
    `PartlySharded` when only modules inside it are: its other parameters would be neither
    sharded nor averaged, and FSDP would reduce its inner modules' gradients on its own."""
    if not isinstance(layer, torch.nn.Module):
        return None
    stage = ShardedStage(layer)
    if not stage.modules:
        return None
    if not isinstance(layer, FSDPModule):
        inner = next(name for name, m in layer.named_modules() if isinstance(m, FSDPModule))
        raise PartlySharded(f"its module {inner!r} is wrapped with fully_shard but the stage layer is not: wrap the "
                            "stage layer too (fully_shard(stage) after its blocks), as torch's pipelining requires")
    return stage


def shard_layers(layers: dict[int, Any], copies: int, shards: int, pipeline: int,
                 reshard_after_forward: bool) -> None:
    """Wrap each stage layer with `fully_shard`, one FSDP unit per stage, over the job's mesh
    (copies x shards x pipeline ranks, global rank = (copy * shards + shard) * pipeline +
    pipeline rank): sharded over its `shards`, replicated over its `copies` (HSDP). Every
    process of the job calls it at the same point: the mesh makes process groups over the
    whole world."""
    from torch.distributed.device_mesh import init_device_mesh

    device = "cuda" if torch.cuda.is_available() and torch.cuda.is_initialized() else "cpu"
    mesh = init_device_mesh(device, (copies, shards, pipeline), mesh_dim_names=("replicate", "shard", "pp"))
    own = mesh["replicate", "shard"] if copies > 1 else mesh["shard"]
    for layer in layers.values():
        fully_shard(layer, mesh=own, reshard_after_forward=reshard_after_forward)
