"""Checks of FSDP2 stages that one process can make (a gloo group of one): a stage layer that
is not itself wrapped is refused, and FSDP mixed precision keeps a Linear's weight gradient in
I. Prints `RESULT {json}`.

    (no arguments; MASTER_ADDR / MASTER_PORT from the test)
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from ppdsl.expansion import parse
from ppdsl.runtime import PipelineSchedule, SetupError
from ppdsl.runtime.torch_backend import split


def main() -> None:
    dist.init_process_group("gloo", rank=0, world_size=1)
    program = parse("pipeline ranks=1 microbatches=2\nuse zb1p()\n", "<fsdp>")
    inner = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4))
    fully_shard(inner[0])  # the stage layer itself is not wrapped
    try:
        PipelineSchedule(program, [inner], lambda y, t: ((y - t) ** 2).mean(), framework="torch")
        partly = "built"
    except SetupError as exc:
        partly = str(exc)
    mixed = torch.nn.Sequential(torch.nn.Linear(4, 4))
    fully_shard(mixed, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    plain = torch.nn.Sequential(torch.nn.Linear(4, 4))
    fully_shard(plain)
    print("RESULT " + json.dumps({"partly": partly, "mixed": split.unsplittable(mixed, "0", mixed[0]),
                                  "plain": split.unsplittable(plain, "0", plain[0])}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
