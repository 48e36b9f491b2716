"""`ScheduleFromFile`: Paddle's and PyTorch's pipelining schedule API, running a `.pps` file's order.

A script written for `paddle.distributed.auto_parallel.pipelining` (or `torch.distributed.pipelining`)
builds `PipelineStage` objects and a schedule (`ScheduleFThenB(stage, n_microbatches, loss_fn=...)`,
`Schedule1F1B`, `ScheduleVPP([stages], ...)`; torch's `ScheduleGPipe`, `Schedule1F1B`,
`ScheduleInterleavedZeroBubble`, ...), then calls
`schedule.step(*args, target=..., losses=...)`. Changing that one schedule line to
`ScheduleFromFile("my.pps", stage, loss_fn, n_microbatches=...)` runs the file's order instead,
with the same `step` contract: the first stage's rank passes the batch's arguments (each
tensor split along dimension 0 into the microbatches), the last stage's rank the target;
`losses` is cleared and filled with each microbatch's loss; keyword arguments go to every
stage this rank holds; `return_output=True` gives the last stage's outputs merged back.
Gradients are summed over microbatches, as Paddle's schedules do (`scale_grads=True`
averages them instead, as torch's schedules do by default: pass it for a torch script).

`stages` is what the rank holds: one `PipelineStage` or a list of them (their `stage_index`
says which stage each is), or plain `paddle.nn.Layer`s / `torch.nn.Module`s (in the order of the
file's stages on this rank), or a dict {stage index: layer}. The framework is read from their
type (any subclass of `torch.nn.Module` means PyTorch, of `paddle.nn.Layer` Paddle), or named
with `framework="torch"` / `"paddle"`. Only each stage's layer is used
(Paddle's `sublayer`, torch's `submod`): ppdsl does its own
shape exchange and communication (one 2-rank group per pair of ranks that talk).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from ...wording import plural
from ...ir import Program
from ..framework import framework_of, get_framework
from ..jobs.process_layout import Layout
from .schedule import PipelineSchedule, SetupError

# Paddle's own options that change how a batch is chunked or merged; ppdsl has one way.
_UNSUPPORTED = ("args_chunk_spec", "kwargs_chunk_spec", "output_merge_spec")


def _is_pipeline_stage(obj: Any) -> bool:
    """Paddle's or torch's `PipelineStage` (duck-typed: importing Paddle's module sets up
    auto-parallel state)."""
    return (hasattr(obj, "sublayer") or hasattr(obj, "submod")) and hasattr(obj, "stage_index") \
        and hasattr(obj, "num_stages")


def _layer_of(stage: Any) -> Any:
    return stage.sublayer if hasattr(stage, "sublayer") else stage.submod


def stage_layers(stages: Any, program: Program, rank: int) -> dict[int, Any]:
    """The user's stages -> {stage index: layer}, checked against the program."""
    if isinstance(stages, Mapping):
        return dict(stages)
    items = list(stages) if isinstance(stages, (list, tuple)) else [stages]
    if items and all(_is_pipeline_stage(s) for s in items):
        out = {}
        for s in items:
            if s.num_stages != program.stages:
                raise SetupError(f"PipelineStage {s.stage_index} was built with num_stages={s.num_stages}, "
                                 f"but the schedule file has {plural(program.stages, 'stage')}")
            out[int(s.stage_index)] = _layer_of(s)
        return out
    if any(_is_pipeline_stage(s) for s in items):
        raise SetupError("give either PipelineStage objects or plain layers, not a mix")
    mine = program.stages_of(rank)
    if len(items) != len(mine):
        raise SetupError(f"rank {rank} holds stages {list(mine)} of the schedule file, but got "
                         f"{plural(len(items), 'layer')}")
    return dict(zip(mine, items))


class ScheduleFromFile:
    """A drop-in for Paddle's pipelining schedules that runs a `.pps` file's order."""

    def __init__(self, path_or_program: str | os.PathLike[str] | Program,
                 stages: Any, loss_fn: Callable[[Any, Any], Any] | None = None,
                 n_microbatches: int | None = None, *, scale_grads: bool = False, timeout: float = 60.0,
                 rank: int | None = None, backend: str | None = None, framework: str | None = None,
                 split_backward: bool = True, grad_guard: bool = True, layout: Layout | None = None,
                 **paddle_options: Any):
        for name in _UNSUPPORTED:
            if paddle_options.pop(name, None) is not None:
                raise SetupError(f"{name} is not supported: ppdsl splits every tensor argument along "
                                 "dimension 0 and concatenates outputs along it")
        if paddle_options:
            raise TypeError(f"ScheduleFromFile got unexpected arguments {sorted(paddle_options)}")
        if isinstance(path_or_program, Program):
            program = path_or_program
        else:
            from ...load import load_program

            program = load_program(os.fspath(path_or_program))
        if n_microbatches is not None and n_microbatches != program.microbatches:
            raise SetupError(f"n_microbatches={n_microbatches}, but the schedule file has "
                             f"microbatches={program.microbatches}")
        first = next(iter(stages.values())) if isinstance(stages, Mapping) else \
            (list(stages)[0] if isinstance(stages, (list, tuple)) and stages else stages)
        fw = get_framework(framework) if framework is not None else \
            framework_of(_layer_of(first) if _is_pipeline_stage(first) else first)
        world = fw.world_size() if fw.is_initialized() else 1
        # Inside a larger job (replicas, shards, tensor ranks) the layout places this process.
        expected = layout.world if layout is not None else program.ranks
        if world != expected:
            inside = f" (the layout's {layout.pipeline} pipeline ranks x {layout.world // layout.pipeline})" \
                if layout is not None else ""
            raise SetupError(f"the schedule file has ranks={program.ranks}{inside}, so {expected} processes should "
                             f"run, but {world} do" + ("" if layout is not None else
                                                       ": in a larger job, pass layout=Layout(...)"))
        if layout is not None:
            rank = layout.pipeline_rank if rank is None else rank
        rank = (fw.rank() if fw.is_initialized() else 0) if rank is None else rank
        self.program = program
        self._schedule = PipelineSchedule(program, stage_layers(stages, program, rank), loss_fn, rank=rank,
                                          timeout=timeout, scale_grads=scale_grads, backend=backend, framework=fw,
                                          split_backward=split_backward, grad_guard=grad_guard, layout=layout)

    @property
    def schedule(self) -> PipelineSchedule:
        """The interpreter underneath (its plan, timings, ...)."""
        return self._schedule

    def step(self, *args: Any, target: Any = None, losses: list[Any] | None = None,
             return_output: bool = False, **kwargs: Any) -> Any:
        """One training (or inference) step over a whole batch, as Paddle's `step`."""
        mine: list[Any] = []
        out = self._schedule.step(*args, target=target, losses=mine, return_output=return_output, **kwargs)
        if losses is not None and self._schedule.plan.last_stage:
            losses.clear()
            losses.extend(mine)
        return out

