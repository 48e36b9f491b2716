"""The PaddlePaddle runtime: the only part of ppdsl that imports paddle, and only lazily.

    from ppdsl.runtime import PipelineSchedule
    sched = PipelineSchedule(load_program("1f1b.pps"), {rank: my_stage}, loss_fn)
    sched.step(inputs, target=targets, losses=losses)

or, as a drop-in for Paddle's `ScheduleFThenB(stage, n, loss_fn=...)`:
`ScheduleFromFile("1f1b.pps", stage, loss_fn, n_microbatches=n)`.

See docs/runtime.md. `ppdsl run` is a thin layer over this API (`worker.py`), with a local
process launcher (`launcher.py`) that needs no paddle itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .from_file import ScheduleFromFile
    from .schedule import MessageOrderError, PipelineSchedule, SetupError, StepError

__all__ = ["MessageOrderError", "PipelineSchedule", "ScheduleFromFile", "SetupError", "StepError", "init_from_env"]


def init_from_env() -> int:
    """`paddle.distributed.init_parallel_env()` and this process's rank (env from a launcher)."""
    import paddle.distributed as dist

    dist.init_parallel_env()
    return int(dist.get_rank())


def __getattr__(name: str) -> Any:
    if name in ("MessageOrderError", "PipelineSchedule", "SetupError", "StepError"):
        from . import schedule

        return getattr(schedule, name)
    if name == "ScheduleFromFile":
        from .from_file import ScheduleFromFile

        return ScheduleFromFile
    raise AttributeError(name)
