"""The runtime on PaddlePaddle or PyTorch: the only part of ppdsl that imports either, and only lazily.

    from ppdsl.runtime import PipelineSchedule
    sched = PipelineSchedule(load_program("1f1b.pps"), {rank: my_stage}, loss_fn)
    sched.step(inputs, target=targets, losses=losses)

or, as a drop-in for Paddle's `ScheduleFThenB(stage, n, loss_fn=...)`:
`ScheduleFromFile("1f1b.pps", stage, loss_fn, n_microbatches=n)`.

The same classes take `torch.nn.Module` stages (or torch's `PipelineStage`s): the
interpreter is written once against `framework.Framework`, whose Paddle and torch adapters
(`paddle_backend`, `torch_backend`) are the only modules that import a framework.

Each action kind runs through a handler (`handlers.py`); `register_handler(kind, fn)` replaces
or wraps one. `Loopback` runs a job's ranks as threads of one process. `ppdsl run` is a thin
layer over this API (`worker.py`), with a local process launcher (`launcher.py`) that needs no
framework itself. The rooms: `interpreter` (a rank's program and its execution), `transport`
(how ranks exchange values), `jobs` (starting and supervising ranks). See docs/runtime.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .jobs.process_layout import Layout

if TYPE_CHECKING:  # pragma: no cover
    from .interpreter.from_file import ScheduleFromFile
    from .interpreter.handlers import ActionContext, register_handler
    from .interpreter.schedule import MessageOrderError, PipelineSchedule, SetupError, StepError
    from .transport.loopback import Loopback
    from .jobs import models
    from .jobs.process_layout import layout_of_fleet

__all__ = ["ActionContext", "Layout", "Loopback", "layout_of_fleet", "models", "MessageOrderError", "PipelineSchedule", "ScheduleFromFile", "SetupError", "StepError",
           "init_from_env", "register_handler"]


def init_from_env(framework: str = "paddle") -> int:
    """Join the job's process group from a launcher's environment (Paddle's
    `init_parallel_env()`, torch's `init_process_group()`) and return this process's rank."""
    from .framework import get_framework

    fw = get_framework(framework)
    fw.init_process_group()
    return fw.rank()


def __getattr__(name: str) -> Any:
    if name in ("MessageOrderError", "PipelineSchedule", "SetupError", "StepError"):
        from .interpreter import schedule

        return getattr(schedule, name)
    if name in ("ActionContext", "register_handler"):
        from .interpreter import handlers

        return getattr(handlers, name)
    if name == "models":  # the built-in model, for scripts that train it (examples/fleet_hybrid)
        from .jobs import models

        return models
    if name == "layout_of_fleet":
        from .jobs.process_layout import layout_of_fleet

        return layout_of_fleet
    if name == "Loopback":
        from .transport.loopback import Loopback

        return Loopback
    if name == "ScheduleFromFile":
        from .interpreter.from_file import ScheduleFromFile

        return ScheduleFromFile
    raise AttributeError(name)
