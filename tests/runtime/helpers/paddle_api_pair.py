"""One rank of the drop-in test: Paddle's ScheduleFThenB and ppdsl's ScheduleFromFile on the
same model, weights and data, in the same process; prints each side's losses and gradients.

    argv: SCHEDULE_FILE STEPS     (started by the launcher, 2 ranks)
"""

from __future__ import annotations

import json
import sys

import numpy as np
import paddle
import paddle.distributed as dist
from paddle.distributed import fleet
from paddle.distributed.auto_parallel.pipelining.schedules import ScheduleFThenB
from paddle.distributed.auto_parallel.pipelining.stage import PipelineStage

from ppdsl.runtime import ScheduleFromFile

M, ROWS, WIDTH = 4, 4, 16


def layer(stage: int) -> paddle.nn.Layer:
    paddle.seed(100 + stage)
    return paddle.nn.Sequential(paddle.nn.Linear(WIDTH, WIDTH), paddle.nn.Tanh(), paddle.nn.Linear(WIDTH, WIDTH))


def loss_fn(out: paddle.Tensor, target: paddle.Tensor) -> paddle.Tensor:
    return paddle.nn.functional.mse_loss(out, target)


def paddle_schedule(layer: paddle.nn.Layer, rank: int) -> ScheduleFThenB:
    stage = PipelineStage(layer, rank, 2)
    schedule = ScheduleFThenB(stage, 4, loss_fn=loss_fn)
    return schedule


def ppdsl_schedule(layer: paddle.nn.Layer, rank: int, path: str) -> ScheduleFromFile:
    stage = PipelineStage(layer, rank, 2)
    schedule = ScheduleFromFile(path, stage, loss_fn, n_microbatches=4)
    return schedule


def train_step(schedule: ScheduleFThenB | ScheduleFromFile, rank: int, x: paddle.Tensor, y: paddle.Tensor,
               losses: list[paddle.Tensor]) -> None:
    if rank == 0:
        schedule.step(x)
    else:
        schedule.step(target=y, losses=losses)


def main(path: str, steps: int) -> None:
    dist.init_parallel_env()
    rank = dist.get_rank()
    fleet.auto.set_mesh(dist.ProcessMesh([0, 1], dim_names=["pp"]))  # Paddle's stages look their rank up here
    theirs_layer, ours_layer = layer(rank), layer(rank)
    sides = (("paddle", paddle_schedule(theirs_layer, rank), theirs_layer),
             ("ppdsl", ppdsl_schedule(ours_layer, rank, path), ours_layer))
    rng = np.random.default_rng(0)
    record: dict[str, list[object]] = {"paddle": [], "ppdsl": []}
    for _ in range(steps):
        x = paddle.to_tensor(rng.standard_normal((M * ROWS, WIDTH)).astype("float32"))
        y = paddle.to_tensor(rng.standard_normal((M * ROWS, WIDTH)).astype("float32"))
        for name, schedule, lay in sides:
            losses: list[paddle.Tensor] = []
            train_step(schedule, rank, x, y, losses)
            grads = [p.grad.numpy().tolist() for p in lay.parameters()]
            record[name].append({"losses": [float(v) for v in losses], "grads": grads})
            with paddle.no_grad():
                for p in lay.parameters():
                    p.set_value(p - 0.1 * p.grad)
            lay.clear_gradients(set_to_zero=False)
    outputs = {}
    for name, schedule, lay in sides:  # the last stage's outputs, merged back into one batch
        if rank == 0:
            schedule.step(x)
        else:
            outputs[name] = schedule.step(target=y, losses=[], return_output=True).numpy().tolist()
        lay.clear_gradients(set_to_zero=False)
    print("RESULT " + json.dumps({**record, "outputs": outputs}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
