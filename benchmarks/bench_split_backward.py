"""Does the split backward pay? zb1p against 1f1b under `ppdsl run`'s interpreter, 2 local ranks.

    python benchmarks/bench_split_backward.py [--rounds 21] [--steps 1] [--rows 128]

The model is `examples/wide_linear.py` (each rank: 2 x Linear(768) + GELU, float32), 8
microbatches of `--rows` rows. In the same two processes it builds, from the same weights:
ppdsl's `1f1b`, `zb1p` (with the split backward), `zb1p` with `split_backward=False` (the old
`paddle.grad` + second backward), `gpipe`, Paddle's own `ScheduleFThenB` (the same order as
gpipe; Paddle's Schedule1F1B deadlocks on gloo), and `zb1p` with `grad_guard=False`. Rounds alternate between them so machine
noise hits all alike; a round's time is the slower rank's, and a ratio is the median over
rounds of the two sides' times within a round (load that drifts between rounds cancels). Per-action times come from
separate profiled steps (stage 1 is rank 1's stage). Prints:

- median `I + W` of stage 1 over median `B` of stage 1 (goal <= 1.10);
- median zb1p step over median 1f1b step (goal <= 0.97);
- zb1p over zb1p without the guard against lost gradients, and the guard's own per-step check
  timed directly, as a share of zb1p's step (goal <= 2%);
- gpipe over Paddle's ScheduleFThenB (as benchmarks/bench_runtime.py), and the others too;
- the machine's core count and the intra-op threads each rank ran with.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rounds import parse_options  # noqa: E402  (beside this file)

MODEL = str(ROOT / "examples" / "wide_linear.py")
SIDES = ("1f1b", "zb1p", "zb1p_unsplit", "gpipe", "paddle", "zb1p_unguarded")


def worker(args: argparse.Namespace) -> None:
    import paddle
    import paddle.distributed as dist
    from paddle.distributed import fleet
    from paddle.distributed.auto_parallel.pipelining.schedules import ScheduleFThenB
    from paddle.distributed.auto_parallel.pipelining.stage import PipelineStage

    from rounds import guard_seconds, stage_actions, time_rounds

    from ppdsl.runtime.framework import get_framework
    from ppdsl.runtime.jobs.models import load_callable
    from ppdsl.runtime.interpreter.preflight import prepare
    from ppdsl.runtime.interpreter.schedule import PipelineSchedule
    from ppdsl.runtime.jobs.worker import apply_threads
    from ppdsl.semantics import CommModel
    from ppdsl.expansion import parse

    apply_threads(get_framework("paddle"))
    dist.init_parallel_env()
    rank = dist.get_rank()
    fleet.auto.set_mesh(dist.ProcessMesh([0, 1], dim_names=["pp"]))  # Paddle's stages look their rank up here
    build = load_callable(f"{MODEL}:build_stage", "model")
    M = 8
    import numpy as np

    rng = np.random.default_rng(0)
    x = paddle.to_tensor(rng.standard_normal((M * args.rows, args.width)).astype("float32"))
    y = paddle.to_tensor(rng.standard_normal((M * args.rows, args.width)).astype("float32"))

    def loss_fn(out: Any, target: Any) -> Any:
        return paddle.nn.functional.mse_loss(out, target)

    def layer() -> Any:
        paddle.seed(rank)
        return build(rank, 2)

    layers: dict[str, Any] = {}
    steps: dict[str, Any] = {}
    for name, gen, split in (("1f1b", "1f1b", True), ("zb1p", "zb1p", True), ("zb1p_unsplit", "zb1p", False),
                             ("gpipe", "gpipe", True), ("zb1p_unguarded", "zb1p", True)):
        program = prepare(parse(f"pipeline ranks=2 microbatches={M}\nuse {gen}()\n", "<bench>"), CommModel.RENDEZVOUS)
        layers[name] = layer()
        sched = PipelineSchedule(program, {rank: layers[name]}, loss_fn, rank=rank, scale_grads=False, timeout=120,
                                 split_backward=split, grad_guard=name != "zb1p_unguarded")
        steps[name] = (lambda s: lambda: s.step(x, target=y, losses=[]))(sched)
        layers[name + "/sched"] = sched
    layers["paddle"] = layer()
    theirs = ScheduleFThenB(PipelineStage(layers["paddle"], rank, 2), M, loss_fn=loss_fn)
    steps["paddle"] = (lambda: theirs.step(x)) if rank == 0 else (lambda: theirs.step(target=y, losses=[]))

    def run(name: str) -> None:
        steps[name]()
        layers[name].clear_gradients(set_to_zero=False)

    # The same gradients after one step from the same weights: the split changes no numbers.
    for name in SIDES:
        steps[name]()
    ref = [p.grad.numpy() for p in layers["1f1b"].parameters()]
    diff = {name: max(float(np.max(np.abs(p.grad.numpy() - r))) / max(1e-30, float(np.max(np.abs(r))))
                      for p, r in zip(layers[name].parameters(), ref)) for name in SIDES}
    for name in SIDES:
        layers[name].clear_gradients(set_to_zero=False)
    profiled = {name: layers[name + "/sched"] for name in ("1f1b", "zb1p")}
    times = time_rounds(SIDES, args.rounds, args.steps, run, dist.barrier, profiled)
    actions = stage_actions(profiled, rank)
    gathered: list[object] = []
    dist.all_gather_object(gathered, {"rank": rank, "times": times, "actions": actions, "diff": diff,
                                      "guard": guard_seconds(layers["zb1p/sched"], steps["zb1p"]),
                                      "threads": os.environ.get("PPDSL_THREADS")})
    if rank == 0:
        print("RESULT " + json.dumps(gathered), flush=True)


def main() -> int:
    args = parse_options(__doc__ or "", steps=1, rounds=21, extra=[])
    if args.worker:
        worker(args)
        return 0
    from rounds import run_wide_linear

    rounds = run_wide_linear(__file__, args, SIDES, timeout=300)
    if rounds is None:
        return 1
    rounds.print_times()
    rounds.print_split()
    print(f"ratio ppdsl gpipe / Paddle ScheduleFThenB: {rounds.ratio('gpipe', 'paddle'):.3f}  (same order; goal <= 1.05); "
          f"1f1b / FThenB {rounds.ratio('1f1b', 'paddle'):.3f}; zb1p / FThenB {rounds.ratio('zb1p', 'paddle'):.3f}")
    rounds.print_guard()
    rounds.print_diff()
    return 0


if __name__ == "__main__":
    sys.exit(main())
