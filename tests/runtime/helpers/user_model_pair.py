"""One rank of the drop-in test on a user's own model: the user's `Block` class (not a
`torch.nn.Sequential`) in torch's `PipelineStage`, run by `ScheduleFromFile`, against the same
model unpipelined on this rank; prints the worst relative gradient difference of this rank's
stages and what of ppdsl was left on them.

    argv: SCHEDULE_FILE SETTING     (started by ppdsl's launcher, 2 ranks)
"""

from __future__ import annotations

import contextlib
import copy
import json
import pickle
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage

sys.path.insert(0, str(Path(__file__).parents[3] / "benchmarks"))
from compat_torch_models import WIDTH, Block  # noqa: E402

from ppdsl.load import load_program  # noqa: E402
from ppdsl.runtime import ScheduleFromFile  # noqa: E402

M, ROWS, SEQ = 4, 2, 3


def main(path: str, setting: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    program = load_program(path)
    dtype = torch.float32 if setting == "autocast_bf16" else torch.float64
    torch.manual_seed(0)
    model = [Block(s == program.stages - 1, setting).to(dtype) for s in range(program.stages)]
    reference = copy.deepcopy(model)
    mine = program.stages_of(rank)
    cpu = torch.device("cpu")
    stages = [PipelineStage(model[s], s, program.stages, cpu) for s in mine]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(M * ROWS, SEQ, WIDTH, generator=g).to(dtype)
    t = torch.randn(M * ROWS, SEQ, WIDTH, generator=g).to(dtype)

    def loss_fn(y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((y.float() - target.float()) ** 2).mean()

    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if setting == "autocast_bf16" else contextlib.nullcontext()
    with autocast:
        for xm, tm in zip(x.chunk(M), t.chunk(M)):
            h = xm
            for s in reference:
                h = s(h)
            (loss_fn(h, tm) / M).backward()
    schedule = ScheduleFromFile(path, stages, loss_fn, n_microbatches=M, scale_grads=True)
    with autocast:
        schedule.step(x if 0 in mine else None, target=t if program.stages - 1 in mine else None)
    worst = 0.0
    for s in mine:
        for (_, p), (_, q) in zip(reference[s].named_parameters(), model[s].named_parameters()):
            worst = max(worst, float((p.grad - q.grad).abs().max() / p.grad.abs().max()))
    schedule.schedule.close()
    left = [type(m).__name__ for s in mine for m in model[s].modules() if "forward" in vars(m)]
    pickle.dumps([model[s] for s in mine])
    print("RESULT " + json.dumps({"worst": worst, "left": left}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
