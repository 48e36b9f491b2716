"""What the label guard costs: first step and later steps, guarded against unguarded, 2 ranks.

    python benchmarks/bench_guard.py [--microbatches 8] [--width 256] [--steps 10] [--rounds 7]

Each round builds two schedules of the same 1F1B program in the same processes, one with the
guard (the default) and one with `_guard=False`, in alternating order, and times each one's
first step (where the notes go out, each with a label when guarded) and the median
of its next `--steps` steps (where nothing should differ). Prints the medians over rounds and
the ratios guarded/unguarded. Gloo on loopback, float32 MLP stages.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROGRAM = "pipeline ranks=2 microbatches={m}\nuse 1f1b()\n"


def worker(args: argparse.Namespace) -> None:
    import numpy as np
    import paddle
    import paddle.distributed as dist

    from ppdsl.runtime.interpreter.schedule import PipelineSchedule
    from ppdsl.expansion import parse

    dist.init_parallel_env()
    rank = dist.get_rank()
    program = parse(PROGRAM.format(m=args.microbatches), "<bench>")
    M, W = args.microbatches, args.width
    rng = np.random.default_rng(0)
    x = paddle.to_tensor(rng.standard_normal((M * args.batch, W)).astype("float32"))
    y = paddle.to_tensor(rng.standard_normal((M * args.batch, W)).astype("float32"))
    paddle.seed(rank)
    layer = paddle.nn.Sequential(paddle.nn.Linear(W, W), paddle.nn.GELU(), paddle.nn.Linear(W, W))

    def loss_fn(out, target):  # type: ignore[no-untyped-def]
        return ((out - target) ** 2).mean()

    times: dict[str, dict[str, list[float]]] = {"guarded": {"first": [], "later": []},
                                                 "unguarded": {"first": [], "later": []}}
    for rnd in range(args.rounds):
        order = ["guarded", "unguarded"] if rnd % 2 == 0 else ["unguarded", "guarded"]
        for name in order:
            sched = PipelineSchedule(program, {rank: layer}, loss_fn, rank=rank, timeout=60,
                                     _guard=name == "guarded")
            dist.barrier()
            t0 = time.perf_counter()
            sched.step(x, target=y)
            times[name]["first"].append(time.perf_counter() - t0)
            later = []
            for _ in range(args.steps):
                dist.barrier()
                t0 = time.perf_counter()
                sched.step(x, target=y)
                later.append(time.perf_counter() - t0)
            times[name]["later"].append(statistics.median(later))
            layer.clear_gradients()
    gathered: list[object] = []
    dist.all_gather_object(gathered, times)
    if rank == 0:
        print("RESULT " + json.dumps(gathered), flush=True)  # what run_ranks reads


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch", type=int, default=16, help="rows per microbatch")
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--steps", type=int, default=10, help="later steps timed per schedule")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return 0
    from bench_runtime import run_ranks

    from ppdsl.runtime.interpreter.preflight import prepare
    from ppdsl.semantics import CommModel
    from ppdsl.expansion import parse

    program = prepare(parse(PROGRAM.format(m=args.microbatches), "<bench>"), CommModel.RENDEZVOUS)
    ranks = run_ranks(__file__, program, ["--worker", "--width", str(args.width), "--batch", str(args.batch),
                                          "--microbatches", str(args.microbatches), "--steps", str(args.steps),
                                          "--rounds", str(args.rounds)])
    if ranks is None:
        return 1
    n_messages = 4 * args.microbatches  # 1F1B on 2 ranks: F and B of each microbatch, both ways
    print(f"1F1B, 2 ranks, {args.microbatches} microbatches of {args.batch} x {args.width} float32, gloo on loopback; "
          f"{n_messages} messages per step; {args.rounds} rounds, alternating")
    for phase in ("first", "later"):
        # A step ends when the slowest rank ends: each round's max over ranks, then medians.
        med = {name: statistics.median(max(r[name][phase][i] for r in ranks) for i in range(args.rounds))
               for name in ("guarded", "unguarded")}
        what = "first step" if phase == "first" else f"later steps (median of {args.steps})"
        print(f"{what:>28}: guarded {med['guarded'] * 1e3:7.3f} ms, unguarded {med['unguarded'] * 1e3:7.3f} ms, "
              f"ratio {med['guarded'] / med['unguarded']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
