"""Each rank steps a 2-rank 1F1B once; the last stage's rank forgets the targets. Every rank
prints the error it got (one line) and exits 0, so the test reads what each was told."""

from __future__ import annotations

import sys
import time

from ppdsl.expansion import parse
from ppdsl.runtime import PipelineSchedule, init_from_env
from ppdsl.runtime.errors import SetupError, StepError
from ppdsl.runtime.jobs import models


def main() -> None:
    rank = init_from_env()
    program = parse("pipeline ranks=2 microbatches=4\nuse 1f1b()\n", "<missing_target>")
    stages = {s: models.build_stage(s, program.stages) for s in program.stages_of(rank)}
    schedule = PipelineSchedule(program, stages, models.loss, timeout=30)
    inputs, targets = next(models.synthetic_batches(program.microbatches))
    t0 = time.monotonic()
    try:
        schedule.step(inputs, target=None if rank == 1 else targets)
        print("ran", flush=True)
    except (SetupError, StepError) as exc:
        print(f"told after {time.monotonic() - t0:.1f} s: {type(exc).__name__}: {exc}", flush=True)
    schedule.close()


if __name__ == "__main__":
    sys.exit(main())
