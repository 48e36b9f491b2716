"""What a schedule checks and decides before its first step: its framework, its place in the
job, the layers of the stages it holds, whether they sit on a GPU, and the loss's shape."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...ir import Program
from ...wording import plural
from ..errors import SetupError
from ..framework import Framework, framework_of, get_framework
from .plan import Plan
from ..jobs.process_layout import Layout


def on_gpu(fw: Framework, layers: Mapping[int, Any]) -> bool:
    """The stages live on a GPU: the one bound by `ppdsl run`, or one the caller moved them to."""
    if fw.device.is_gpu:
        return True
    return any(fw.is_on_gpu(p) for layer in layers.values() for _, p in fw.named_parameters(layer))


def layout(fw: Framework, program: Program, rank: int | None, layout: Layout | None) -> Layout:
    """This process's place: the layout given (checked against the program), else one replica."""
    if layout is None:
        return Layout.single(max(program.ranks, 1 + (rank if rank is not None else fw.rank())),
                             fw.rank() if rank is None else rank)
    if layout.pipeline != program.ranks:
        raise SetupError(f"the layout has {plural(layout.pipeline, 'pipeline rank')} but the program "
                         f"{plural(program.ranks, 'rank')}")
    if rank is not None and rank != layout.pipeline_rank:
        raise SetupError(f"rank={rank} but the layout puts global rank {layout.rank} at pipeline rank "
                         f"{layout.pipeline_rank} (give one of them)")
    return layout


def framework(framework: str | Framework | None, stages: Mapping[int, Any] | Sequence[Any]) -> Framework:
    """The adapter asked for, else the one the stage layers belong to (Paddle when none)."""
    if isinstance(framework, Framework):
        return framework
    if framework is not None:
        return get_framework(framework)
    layers = list(stages.values()) if isinstance(stages, Mapping) else list(stages)
    return framework_of(layers[0]) if layers else get_framework()


def stage_map(fw: Framework, stages: Mapping[int, Any] | Sequence[Any], plan: Plan) -> dict[int, Any]:
    if isinstance(stages, Mapping):
        layers = dict(stages)
    else:
        seq = list(stages)
        if len(seq) != len(plan.local_stages):
            raise SetupError(f"rank {plan.rank} holds stages {list(plan.local_stages)} of the program, "
                             f"but {len(seq)} stage layers were given")
        layers = dict(zip(plan.local_stages, seq))
    if sorted(layers) != list(plan.local_stages):
        raise SetupError(f"rank {plan.rank} holds stages {list(plan.local_stages)} of the program, "
                         f"but layers were given for stages {sorted(layers)}")
    for s, layer in layers.items():
        if not fw.is_layer(layer):
            raise SetupError(f"stage {s}: expected a {fw.layer_type}, got {type(layer).__name__}")
    return layers


def check_loss(fw: Framework, loss: Any) -> None:
    if not fw.is_tensor(loss):
        raise SetupError(f"the loss function returned {type(loss).__name__}, not a {fw.tensor_type}")
    if fw.numel(loss) != 1:
        raise SetupError(f"the loss function returned a tensor of shape {list(loss.shape)}; "
                         "it must return a scalar (reduce it, e.g. with .mean())")
