"""ppdsl on PyTorch against torch's own pipelining runtime, and whether the split backward pays.

    python benchmarks/bench_torch.py [--rounds 11] [--steps 2] [--rows 128] [--width 768]

Two local ranks on gloo, one float32 stage per rank: `--blocks` x (Linear(`--width`) + GELU),
8 microbatches of `--rows` rows, mean squared error, gradients averaged over the microbatches
(torch's default). In the same two processes, each side built from the same weights:

- ppdsl's `gpipe`, `1f1b` and `zb1p` (the split backward), `zb1p` with
  `split_backward=False` (I by `torch.autograd.grad`, W by a second backward), and `zb1p` with
  `grad_guard=False` (the guard against lost gradients off: its cost);
- torch's `ScheduleGPipe` and `Schedule1F1B` on `PipelineStage`s, and torch's CSV runtime
  (`_PipelineScheduleRuntime._load_csv`) running the zb1p order that `ppdsl convert` writes.

Rounds alternate the order of the sides so machine noise hits all alike; a round's time is the
slower rank's, and a ratio is the median over rounds of the two sides' times within a round.
Per-action times come from separate profiled ppdsl steps. Prints per-side medians; ppdsl /
torch per schedule (goal <= 1.05); (I + W) / B on stage 1 (goal <= 1.10); zb1p / 1f1b
(goal <= 0.97); the largest gradient difference between the sides after one step.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rounds import parse_options  # noqa: E402  (beside this file)

M = 8  # microbatches
ORDERS = ("gpipe", "1f1b", "zb1p")
# Sides that are compared stand next to each other, so a ratio compares steps close in time.
SIDES = ("gpipe", "torch_gpipe", "torch_1f1b", "1f1b", "zb1p", "torch_zb1p", "zb1p_unsplit", "zb1p_unguarded")


def _program_text(order: str) -> str:
    return f"pipeline ranks=2 microbatches={M}\nuse {order}()\n"


def _torch_csv(order: str) -> str:
    """The order as PyTorch's schedule CSV (what `ppdsl convert x.pps x.csv` writes)."""
    from ppdsl.formats.torch_csv import write_csv
    from ppdsl.load import load_program

    with tempfile.TemporaryDirectory() as tmp:
        pps = Path(tmp) / f"{order}.pps"
        pps.write_text(_program_text(order))
        text, _ = write_csv(load_program(str(pps)))
    return text


def worker(args: argparse.Namespace) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import Schedule1F1B, ScheduleGPipe, _PipelineScheduleRuntime

    from rounds import block_layer, compare_and_time, gather_and_end, guard_seconds, stage_actions

    from ppdsl.runtime.framework import get_framework
    from ppdsl.runtime.interpreter.preflight import prepare
    from ppdsl.runtime.interpreter.schedule import PipelineSchedule
    from ppdsl.runtime.jobs.worker import apply_threads
    from ppdsl.semantics import CommModel
    from ppdsl.expansion import parse

    apply_threads(get_framework("torch"))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cpu = torch.device("cpu")
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((M * args.rows, args.width)).astype("float32"))
    y = torch.from_numpy(rng.standard_normal((M * args.rows, args.width)).astype("float32"))

    def loss_fn(out: Any, target: Any) -> Any:
        return torch.nn.functional.mse_loss(out, target)

    def layer() -> Any:
        return block_layer(args.width, args.blocks, 100 + rank)

    layers: dict[str, Any] = {}
    steps: dict[str, Any] = {}
    ours: dict[str, PipelineSchedule] = {}
    for name, order, split in (("gpipe", "gpipe", True), ("1f1b", "1f1b", True), ("zb1p", "zb1p", True),
                               ("zb1p_unsplit", "zb1p", False), ("zb1p_unguarded", "zb1p", True)):
        program = prepare(parse(_program_text(order), "<bench>"), CommModel.RENDEZVOUS)
        layers[name] = layer()
        ours[name] = PipelineSchedule(program, {rank: layers[name]}, loss_fn, rank=rank, scale_grads=True,
                                      timeout=120, split_backward=split, framework="torch",
                                      grad_guard=name != "zb1p_unguarded")
        steps[name] = (lambda s: lambda: s.step(x, target=y, losses=[]))(ours[name])
    csv_file = Path(tempfile.mkdtemp(prefix="ppdsl-bench-torch-")) / "zb1p.csv"
    csv_file.write_text(_torch_csv("zb1p"))
    for name in ("torch_gpipe", "torch_1f1b", "torch_zb1p"):
        layers[name] = layer()
        stage = PipelineStage(layers[name], rank, 2, cpu)
        if name == "torch_zb1p":
            theirs: Any = _PipelineScheduleRuntime([stage], M, loss_fn=loss_fn)
            theirs._load_csv(str(csv_file))
        else:
            theirs = (ScheduleGPipe if name == "torch_gpipe" else Schedule1F1B)(stage, M, loss_fn=loss_fn)
        steps[name] = (lambda s: (lambda: s.step(x)) if rank == 0 else (lambda: s.step(target=y, losses=[])))(theirs)

    profiled = {name: ours[name] for name in ("1f1b", "zb1p")}
    diff, times = compare_and_time(SIDES, steps, layers, "1f1b", args.rounds, args.steps, dist.barrier, profiled)
    actions = stage_actions(profiled, rank)
    gather_and_end({"rank": rank, "times": times, "actions": actions, "diff": diff,
                    "guard": guard_seconds(ours["zb1p"], steps["zb1p"]), "threads": torch.get_num_threads()})


def main() -> int:
    args = parse_options(__doc__ or "", steps=2, rounds=11, extra=[("--blocks", 2, "Linear + GELU blocks per rank")])
    if args.worker:
        worker(args)
        return 0
    from rounds import run_block_ranks

    from ppdsl.runtime.jobs.launcher import cores
    from ppdsl.runtime.interpreter.preflight import prepare
    from ppdsl.semantics import CommModel
    from ppdsl.expansion import parse

    program = prepare(parse(_program_text("gpipe"), "<bench>"), CommModel.RENDEZVOUS)
    rounds = run_block_ranks(__file__, program, 2, args, SIDES, timeout=600)
    if rounds is None:
        return 1
    results = rounds.results
    print(f"machine: {cores()} cores, load average {os.getloadavg()[0]:.1f}; 2 ranks x {results[0]['threads']} "
          f"intra-op thread(s); model: each rank {args.blocks} x Linear({args.width}) + GELU, float32, {M} "
          f"microbatches of {args.rows} rows; {args.rounds} rounds x {args.steps} steps, alternating")
    rounds.print_times()
    for order in ORDERS:
        print(f"ratio ppdsl / torch {order:5s}: {rounds.ratio(order, 'torch_' + order):.3f}  (goal <= 1.05)")
    rounds.print_split()
    print(f"ratio torch's zb1p / torch's 1f1b: {rounds.ratio('torch_zb1p', 'torch_1f1b'):.3f}")
    rounds.print_guard()
    rounds.print_diff()
    return 0


if __name__ == "__main__":
    sys.exit(main())
