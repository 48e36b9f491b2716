"""One rank of the sharded pipeline through the Python API: 2 pipeline ranks x 2 shards (four
processes on gloo), each stage wrapped with `fully_shard` over its shard pair of the job's
mesh, the program's UNSHARD/RESHARD/REDUCE_GRAD placed by `add_shard_actions`. Two steps with
an optimizer between them, against the model unsharded and unpipelined on the whole global
batch (each shard trains on its half); prints the worst relative difference of the full
gradients and how many reduce-scatters each step made on this rank. An evaluation runs
between each step and its optimizer step.

    argv: GENERATOR     (started by ppdsl's launcher, 4 processes)
"""

from __future__ import annotations

import copy
import json
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from ppdsl.expansion import parse
from ppdsl.runtime import Layout, PipelineSchedule
from ppdsl.shard_actions import add_shard_actions

M, WIDTH = 4, 8


def stage_layer(s: int) -> torch.nn.Module:
    torch.manual_seed(s)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh(), torch.nn.Linear(WIDTH, WIDTH)).double()


def main(generator: str) -> None:
    dist.init_process_group("gloo")
    program = add_shard_actions(parse(f"pipeline ranks=2 microbatches={M}\nuse {generator}()\n", "<fsdp>"))
    layout = Layout(pipeline=2, replicas=2, rank=dist.get_rank(), shards=2)
    placement = program.placement
    mine = {s: stage_layer(s) for s in range(program.stages) if placement[s] == layout.pipeline_rank}
    reference = [stage_layer(s) for s in range(program.stages)]
    # The job's mesh: global rank = (copy * shards + shard) * pipeline + pipeline rank.
    mesh = init_device_mesh("cpu", (1, 2, 2), mesh_dim_names=("replicate", "shard", "pp"))
    for layer in mine.values():
        fully_shard(layer, mesh=mesh["shard"], reshard_after_forward=False)

    def loss_fn(y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((y - target) ** 2).mean()

    counted: list[int] = []
    real = dist.reduce_scatter_single

    def counting(*args: Any, **kwargs: Any) -> Any:
        counted[-1] += 1
        return real(*args, **kwargs)

    dist.reduce_scatter_single = counting
    schedule = PipelineSchedule(program, mine, loss_fn, layout=layout, framework="torch")
    optimizer = torch.optim.SGD([p for layer in mine.values() for p in layer.parameters()], lr=0.1)
    ref_optimizer = torch.optim.SGD([p for layer in reference for p in layer.parameters()], lr=0.1)
    g = torch.Generator().manual_seed(1)
    worst = 0.0
    for _ in range(2):
        x = torch.randn(2 * 2 * M, WIDTH, generator=g, dtype=torch.float64)
        t = torch.randn(2 * 2 * M, WIDTH, generator=g, dtype=torch.float64)
        for xm, tm in zip(x.chunk(2 * M), t.chunk(2 * M)):
            h = xm
            for layer in reference:
                h = layer(h)
            (loss_fn(h, tm) / (2 * M)).backward()
        start, stop = layout.share(x.shape[0])
        counted.append(0)
        schedule.step(x[start:stop], target=t[start:stop])
        for s, layer in sorted(mine.items()):
            for p, q in zip(reference[s].parameters(), layer.parameters()):
                want, got = p.grad, q.grad.full_tensor()
                worst = max(worst, float((want - got).abs().max() / want.abs().max()))
        # A forward-only pass before the optimizer steps: the next step must gather the weights
        # the optimizer makes, not keep what the evaluation gathered before them.
        schedule.eval(x[start:stop])
        optimizer.step()
        optimizer.zero_grad()
        ref_optimizer.step()
        ref_optimizer.zero_grad()
    schedule.close()
    print("RESULT " + json.dumps({"worst": worst, "reduce_scatters": counted, "stages": len(mine)}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
