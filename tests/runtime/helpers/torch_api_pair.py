"""One rank of the torch drop-in test: torch's own pipelining schedule class and ppdsl's
`ScheduleFromFile` on the same model, weights and data, in the same process; prints each
side's losses and gradients.

    argv: SCHEDULE_FILE STEPS TORCH_CLASS     (started by ppdsl's launcher, 2 ranks)
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, schedules

from ppdsl.runtime import ScheduleFromFile

M, ROWS, WIDTH = 4, 4, 16


def layer(stage: int) -> torch.nn.Module:
    torch.manual_seed(100 + stage)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh(), torch.nn.Linear(WIDTH, WIDTH))


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(out, target)


def main(path: str, steps: int, torch_class: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cpu = torch.device("cpu")
    theirs_layer, ours_layer = layer(rank), layer(rank)
    theirs = getattr(schedules, torch_class)(PipelineStage(theirs_layer, rank, 2, cpu), M, loss_fn=loss_fn)
    # torch's schedules average the microbatch gradients by default; so does ppdsl with scale_grads.
    ours = ScheduleFromFile(path, PipelineStage(ours_layer, rank, 2, cpu), loss_fn, n_microbatches=M,
                            scale_grads=True)
    sides = (("torch", theirs, theirs_layer), ("ppdsl", ours, ours_layer))
    rng = np.random.default_rng(0)
    record: dict[str, list[object]] = {"torch": [], "ppdsl": []}
    for _ in range(steps):
        x = torch.from_numpy(rng.standard_normal((M * ROWS, WIDTH)).astype("float32"))
        y = torch.from_numpy(rng.standard_normal((M * ROWS, WIDTH)).astype("float32"))
        for name, schedule, lay in sides:
            losses: list[torch.Tensor] = []
            if rank == 0:
                schedule.step(x)
            else:
                schedule.step(target=y, losses=losses)
            grads = [p.grad.numpy().tolist() for p in lay.parameters()]
            record[name].append({"losses": [float(v) for v in losses], "grads": grads})
            with torch.no_grad():
                for p in lay.parameters():
                    p -= 0.1 * p.grad
            lay.zero_grad(set_to_none=False)
    print("RESULT " + json.dumps(record), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
