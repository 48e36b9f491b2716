"""One process of a pipeline x data-parallel job through the API: `PipelineSchedule(...,
layout=...)`, each replica on its own rows, SGD after every step; prints a RESULT line with
this rank's weights after the steps (started by the launcher with replicas=2).

    argv: SCHEDULE_FILE STEPS REPLICAS
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import paddle
import paddle.distributed as dist

from ppdsl.load import load_program
from ppdsl.runtime import Layout, PipelineSchedule, models


def main() -> None:
    path, steps, replicas = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    dist.init_parallel_env()
    program = load_program(path)
    layout = Layout(program.ranks, replicas, dist.get_rank())
    stages = models.build_stages(models.build_stage, program.stages_of(layout.pipeline_rank), program.stages, 0,
                                 "built-in")
    sched = PipelineSchedule(program, stages, models.loss, layout=layout, timeout=30)
    params = [p for s in sorted(stages) for p in stages[s].parameters()]
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=params)
    batches = models.synthetic_batches(program.microbatches * replicas, seed=1)
    for _ in range(steps):
        x, y = next(batches)
        start, stop = layout.share(int(x.shape[0]))
        sched.step(x[start:stop], target=y[start:stop])
        opt.step()
        opt.clear_grad()
    weights = {f"{s}.{n}": np.asarray(p.numpy(), dtype="float64").ravel().tolist()
               for s in sorted(stages) for n, p in stages[s].named_parameters()}
    print("RESULT " + json.dumps({"rank": layout.rank, "replica": layout.replica, "weights": weights}), flush=True)
    sys.stdout.flush()
    os._exit(0)  # the gloo groups' teardown at exit is not what this script tests


if __name__ == "__main__":
    main()
