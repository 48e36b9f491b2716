"""One step of a program through the Python API with the checker bypassed (`check=False`).

A failure is reported to the launching test the way `ppdsl run`'s ranks report theirs, so the
launcher stops the other ranks and names the cause."""

from __future__ import annotations

import sys

from ppdsl.load import load_program
from ppdsl.runtime import PipelineSchedule, StepError, init_from_env, models
from ppdsl.runtime.jobs.watchdog import Reporter

rank = init_from_env()
program = load_program(sys.argv[1])
layers = {s: models.build_stage(s, program.stages) for s in program.stages_of(rank)}
schedule = PipelineSchedule(program, layers, models.loss, timeout=60, check=False)
inputs, target = next(models.synthetic_batches(program.microbatches))
try:
    schedule.step(inputs, target=target)
except StepError as exc:
    Reporter(rank).send("error", step=exc.step, action=exc.action, message=str(exc), peer=exc.peer,
                        kind=type(exc).__name__)
    sys.exit(1)
