"""ppdsl with FSDP2 stages against torch's own schedule classes with the same FSDP2 stages.

    python benchmarks/bench_fsdp.py [--rounds 11] [--steps 2] [--rows 128] [--width 768] [--blocks 2]

Four local processes on gloo: 2 pipeline ranks x 2 shards, one float32 stage per pipeline
rank (`--blocks` x (Linear(`--width`) + GELU)), each stage wrapped with `fully_shard` over its
shard pair of one device mesh (shard x pp), 8 microbatches of `--rows` rows per shard, mean
squared error, gradients averaged. In the same four processes, each side from the same weights:

- ppdsl's `gpipe`, `1f1b` and `zb1p` with UNSHARD/RESHARD/REDUCE_GRAD placed by
  `add_shard_actions` (one all-gather per stage and step, one reduce-scatter at REDUCE_GRAD;
  zb1p's Linears defer their weight gradients to W);
- torch's `ScheduleGPipe` and `Schedule1F1B` on `PipelineStage`s over the pp group (FSDP
  gathers on the first forward, one reduce-scatter at the end of the step).

Rounds alternate the order of the sides; a round's time is the slowest rank's, a ratio the
median over rounds of the two sides' times within a round. Prints per-side medians, ppdsl /
torch per schedule (goal <= 1.05), ppdsl's zb1p / 1f1b, and the largest gradient difference between the sides after
one step from the same weights. Four processes want four cores: on fewer, the operating
system's scheduler is part of what is timed (the header says how many there are).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rounds import parse_options  # noqa: E402  (beside this file)

M = 8  # microbatches
ORDERS = ("gpipe", "1f1b")
SIDES = ("gpipe", "torch_gpipe", "torch_1f1b", "1f1b", "zb1p")


def worker(args: Any) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import Schedule1F1B, ScheduleGPipe

    from rounds import block_layer, compare_and_time, gather_and_end

    from ppdsl.expansion import parse
    from ppdsl.runtime import Layout, PipelineSchedule
    from ppdsl.runtime.framework import get_framework
    from ppdsl.runtime.jobs.worker import apply_threads
    from ppdsl.shard_actions import add_shard_actions

    apply_threads(get_framework("torch"))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    layout = Layout(pipeline=2, replicas=2, rank=rank, shards=2)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("shard", "pp"))  # rank = shard * 2 + pp
    pp = layout.pipeline_rank
    rng = np.random.default_rng(0)
    rows = 2 * M * args.rows  # the global batch; each shard trains on its half
    x = torch.from_numpy(rng.standard_normal((rows, args.width)).astype("float32"))
    y = torch.from_numpy(rng.standard_normal((rows, args.width)).astype("float32"))
    start, stop = layout.share(rows)
    x, y = x[start:stop], y[start:stop]

    loss_fn = torch.nn.functional.mse_loss
    def layer() -> Any:
        module = block_layer(args.width, args.blocks, 100 + pp)
        fully_shard(module, mesh=mesh["shard"], reshard_after_forward=False)
        return module

    layers: dict[str, Any] = {}
    steps: dict[str, Any] = {}
    for order in (*ORDERS, "zb1p"):
        program = add_shard_actions(parse(f"pipeline ranks=2 microbatches={M}\nuse {order}()\n", "<bench>"))
        layers[order] = layer()
        ours = PipelineSchedule(program, {pp: layers[order]}, loss_fn, layout=layout, timeout=120, framework="torch")
        steps[order] = (lambda s: lambda: s.step(x, target=y, losses=[]))(ours)
        if order not in ORDERS:
            continue
        name = "torch_" + order
        layers[name] = layer()
        stage = PipelineStage(layers[name], pp, 2, torch.device("cpu"), group=mesh["pp"].get_group())
        theirs = (ScheduleGPipe if order == "gpipe" else Schedule1F1B)(stage, M, loss_fn=loss_fn)
        steps[name] = (lambda s: (lambda: s.step(x)) if pp == 0 else (lambda: s.step(target=y, losses=[])))(theirs)

    diff, times = compare_and_time(SIDES, steps, layers, "1f1b", args.rounds, args.steps, dist.barrier, {},
                                   whole=lambda g: g.full_tensor())
    gather_and_end({"rank": rank, "times": times, "actions": {}, "diff": diff, "threads": torch.get_num_threads()})


def main() -> int:
    args = parse_options(__doc__ or "", steps=2, rounds=11, extra=[("--blocks", 2, "Linear + GELU blocks per stage")])
    if args.worker:
        worker(args)
        return 0
    from rounds import run_block_ranks

    from ppdsl.expansion import parse
    from ppdsl.runtime.jobs.launcher import cores

    four = parse("pipeline ranks=4 microbatches=4\nuse 1f1b()\n", "<bench>")  # the launcher counts 4 processes
    rounds = run_block_ranks(__file__, four, 4, args, SIDES, timeout=900)
    if rounds is None:
        return 1
    results = rounds.results
    print(f"machine: {cores()} cores, load average {os.getloadavg()[0]:.1f}; 2 ranks x 2 shards, "
          f"{results[0]['threads']} intra-op thread(s) each; model: each stage {args.blocks} x Linear({args.width}) "
          f"+ GELU, float32, FSDP2; {M} microbatches of {args.rows} rows per shard; {args.rounds} rounds x "
          f"{args.steps} steps, alternating")
    rounds.print_times()
    for order in ORDERS:
        print(f"ratio ppdsl / torch {order:5s}: {rounds.ratio(order, 'torch_' + order):.3f}  (goal <= 1.05)")
    print(f"ratio ppdsl zb1p / ppdsl 1f1b: {rounds.ratio('zb1p', '1f1b'):.3f}  (the split backward on sharded stages)")
    rounds.print_diff()
    return 0


if __name__ == "__main__":
    sys.exit(main())
