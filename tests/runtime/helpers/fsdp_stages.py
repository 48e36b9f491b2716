"""One rank of the FSDP2 test: every stage of a one-rank program wrapped with `fully_shard`
over the 2 processes (each holds the whole pipeline, its parameters sharded in two), one step
on the same batch, against the model unpipelined and unsharded; prints the worst relative
difference of the full gradients and the path each stage's weight gradients took. The
program places no sharding actions: FSDP gathers in the forward, and the schedule reduces
each stage once its last backward has run.

    argv: GENERATOR     (started by ppdsl's launcher, 2 processes)
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).parents[3] / "benchmarks"))
from compat_torch_models import WIDTH, Block  # noqa: E402

from ppdsl.expansion import parse  # noqa: E402
from ppdsl.runtime import PipelineSchedule  # noqa: E402

M = 4


def main(generator: str) -> None:
    dist.init_process_group("gloo")
    program = parse(f"pipeline ranks=1 microbatches={M}\nuse {generator}()\n", "<fsdp>")
    torch.manual_seed(0)
    stages = [Block(s == program.stages - 1, "checkpoint").double() for s in range(program.stages)]
    reference = copy.deepcopy(stages)
    for stage in stages:
        fully_shard(stage)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2 * M, 3, WIDTH, generator=g, dtype=torch.float64)
    t = torch.randn(2 * M, 3, WIDTH, generator=g, dtype=torch.float64)

    def loss_fn(y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((y - target) ** 2).mean()

    for xm, tm in zip(x.chunk(M), t.chunk(M)):
        h = xm
        for s in reference:
            h = s(h)
        (loss_fn(h, tm) / M).backward()
    schedule = PipelineSchedule(program, stages, loss_fn, rank=0, framework="torch")
    schedule.step(x, target=t)
    worst = 0.0
    for a, b in zip(reference, stages):
        for (_, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
            worst = max(worst, float((p.grad - q.grad.full_tensor()).abs().max() / p.grad.abs().max()))
    schedule.close()
    print("RESULT " + json.dumps({"worst": worst, "paths": schedule.split_paths}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
