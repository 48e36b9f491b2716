"""Step time of `ppdsl run`'s interpreter against Paddle's own ScheduleFThenB, on 2 local ranks.

    python benchmarks/bench_runtime.py [--width 512] [--microbatches 4] [--steps 20] [--profile out.json]

Both run the same GPipe (fill-drain) order, the same model (one float32 MLP stage per rank),
the same data and the same loss in the same processes, alternating rounds so machine noise
hits both alike. Paddle's Schedule1F1B is not compared: it deadlocks on gloo (it fuses a
forward send with a backward receive on both ranks). Gradients are summed over microbatches
on both sides (Paddle's convention). Prints per-step medians, the ratio (goal <= 1.05), the
interpreter's own cost per action, and, with --profile, writes measured per-action times in
the simulator's profile format and compares the simulated makespan with the measured step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROGRAM = "pipeline ranks=2 microbatches={m}\nuse gpipe()\n"


def _stage(width: int, stage: int, seed: int):  # type: ignore[no-untyped-def]
    import paddle

    paddle.seed(seed + stage)
    layers = [paddle.nn.Linear(width, width), paddle.nn.GELU(), paddle.nn.Linear(width, width), paddle.nn.GELU()]
    return paddle.nn.Sequential(*layers)


def worker(args: argparse.Namespace) -> None:
    import numpy as np
    import paddle
    import paddle.distributed as dist
    from paddle.distributed.auto_parallel.pipelining.schedules import ScheduleFThenB
    from paddle.distributed.auto_parallel.pipelining.stage import PipelineStage

    from ppdsl.runtime.interpreter.preflight import prepare
    from ppdsl.runtime.jobs.profile import local_actions
    from ppdsl.runtime.interpreter.schedule import PipelineSchedule
    from ppdsl.semantics import CommModel
    from ppdsl.expansion import parse

    from paddle.distributed import fleet

    dist.init_parallel_env()
    rank = dist.get_rank()
    fleet.auto.set_mesh(dist.ProcessMesh([0, 1], dim_names=["pp"]))  # Paddle's stages look their rank up here
    M, W = args.microbatches, args.width
    rng = np.random.default_rng(0)
    x = paddle.to_tensor(rng.standard_normal((M * args.batch, W)).astype("float32"))
    y = paddle.to_tensor(rng.standard_normal((M * args.batch, W)).astype("float32"))

    def loss_fn(out, target):  # type: ignore[no-untyped-def]
        return paddle.nn.functional.mse_loss(out, target)

    paddle_layer = _stage(W, rank, 0)
    stage = PipelineStage(paddle_layer, rank, 2)
    theirs = ScheduleFThenB(stage, M, loss_fn=loss_fn)
    program = prepare(parse(PROGRAM.format(m=M), "<bench>"), CommModel.RENDEZVOUS)
    our_layer = _stage(W, rank, 0)
    ours = PipelineSchedule(program, {rank: our_layer}, loss_fn, rank=rank, scale_grads=False, timeout=60)

    def run_paddle() -> None:
        if rank == 0:
            theirs.step(x)
        else:
            theirs.step(target=y, losses=[])
        paddle_layer.clear_gradients(set_to_zero=False)

    def run_ppdsl() -> None:
        ours.step(x, target=y, losses=[])
        our_layer.clear_gradients(set_to_zero=False)

    # Same work on both sides: one step each from the same weights gives the same gradients.
    if rank == 0:
        theirs.step(x)
    else:
        theirs.step(target=y, losses=[])
    ours.step(x, target=y, losses=[])
    same = max(float((a.grad - b.grad).abs().max()) for a, b in zip(paddle_layer.parameters(), our_layer.parameters()))
    paddle_layer.clear_gradients(set_to_zero=False)
    our_layer.clear_gradients(set_to_zero=False)
    times: dict[str, list[float]] = {"paddle": [], "ppdsl": []}
    for fn in (run_paddle, run_ppdsl):  # warm-up: first allocations
        fn()
    for _ in range(args.rounds):
        for name, fn in (("paddle", run_paddle), ("ppdsl", run_ppdsl)):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                fn()
            times[name].append((time.perf_counter() - t0) / args.steps)

    # The interpreter's own cost: the dispatch loop with every handler replaced by a no-op,
    # and the step with per-action timers (what --profile measures).
    compiled = ours._compiled
    n_actions = len(compiled)
    reps = 2000
    t0 = time.perf_counter()
    for _ in range(reps):
        for _handler, op in compiled:
            _noop(op)
    dispatch = (time.perf_counter() - t0) / reps / n_actions
    ours.profile = True
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        run_ppdsl()
    profiled_step = (time.perf_counter() - t0) / args.steps
    inside = sum(sum(v) for v in ours.timings.values()) / (args.steps + 0)
    actions = local_actions(ours.timings, 0, ours.started)
    gathered: list[object] = []
    dist.all_gather_object(gathered, {"rank": rank, "times": times, "dispatch": dispatch, "actions": actions,
                                      "profiled_step": profiled_step, "inside": inside, "n_actions": n_actions,
                                      "grad_diff": same})
    if rank == 0:
        print("RESULT " + json.dumps(gathered), flush=True)


def _noop(op: object) -> None:
    return None


def run_ranks(script: str, program: object, argv: list[str], timeout: float = 120, threads: int | None = None
              ) -> list[dict[str, Any]] | None:
    """`script --worker ...` on the program's ranks; what rank 0 printed after `RESULT ` (None: failed)."""
    import tempfile

    from ppdsl.runtime.jobs.launcher import launch

    logs = tempfile.mkdtemp(prefix="ppdsl-bench-")
    outcome = launch([program], argv, steps=0, timeout=timeout, quiet=True, keep_logs=logs,  # type: ignore[list-item]
                     command=[sys.executable, os.path.abspath(script)], threads=threads)
    text = (Path(logs) / "rank0.log").read_text(errors="replace")
    line = next((x for x in text.splitlines() if x.startswith("RESULT ")), None)
    if outcome.code != 0 or line is None:
        print(f"benchmark failed: {outcome.failure}; logs in {logs}", file=sys.stderr)
        return None
    return json.loads(line[len("RESULT "):])  # type: ignore[no-any-return]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--batch", type=int, default=32, help="rows per microbatch")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--steps", type=int, default=10, help="steps per timed round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--profile", metavar="OUT.json")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return 0
    from ppdsl.profiles import parse_profile, profile_json
    from ppdsl.runtime.jobs.profile import pair_messages
    from ppdsl.runtime.interpreter.preflight import prepare
    from ppdsl.semantics import CommModel
    from ppdsl.simulate import simulate
    from ppdsl.expansion import parse

    program = prepare(parse(PROGRAM.format(m=args.microbatches), "<bench>"), CommModel.RENDEZVOUS)
    argv = ["--worker", "--width", str(args.width), "--batch", str(args.batch), "--microbatches",
            str(args.microbatches), "--steps", str(args.steps), "--rounds", str(args.rounds)]
    results = run_ranks(__file__, program, argv)
    if results is None:
        return 1
    # A step ends when the slowest rank ends: take each round's max over ranks.
    per = {name: [max(r["times"][name][i] for r in results) for i in range(args.rounds)] for name in ("paddle", "ppdsl")}
    theirs, ours = statistics.median(per["paddle"]), statistics.median(per["ppdsl"])
    n_actions = sum(r["n_actions"] for r in results)
    print(f"model: 2 stages x 2 Linear({args.width}) + GELU, {args.microbatches} microbatches of {args.batch} rows, "
          f"float32, gloo on loopback, GPipe/FThenB order")
    print(f"Paddle ScheduleFThenB: {theirs * 1e3:8.3f} ms/step  (rounds: {', '.join(f'{t * 1e3:.2f}' for t in per['paddle'])})")
    print(f"ppdsl PipelineSchedule: {ours * 1e3:8.3f} ms/step  (rounds: {', '.join(f'{t * 1e3:.2f}' for t in per['ppdsl'])})")
    print(f"ratio ppdsl/paddle: {ours / theirs:.3f}  (goal <= 1.05); same gradients after one step: "
          f"max |difference| {max(r['grad_diff'] for r in results):.1e}")
    dispatch = max(r["dispatch"] for r in results)
    timer = max((r["profiled_step"] - r["inside"]) / r["n_actions"] for r in results)
    print(f"interpreter overhead per action: dispatch loop {dispatch * 1e6:.2f} us; "
          f"per-step bookkeeping (split, timers, clear) spread per action {timer * 1e6:.2f} us; "
          f"difference to Paddle per action {(ours - theirs) / max(1, n_actions) * 1e6:+.2f} us "
          f"({n_actions} actions per step over both ranks)")
    if args.profile:
        actions = [dict(a, rank=r["rank"]) for r in results for a in r["actions"]]
        pair_messages(actions)  # as `ppdsl run --profile` does: one machine, one clock
        text = profile_json({}, unit="us", actions=actions)
        Path(args.profile).write_text(text, encoding="utf-8")
        sim = simulate(program, parse_profile(text), "rendezvous")
        measured = ours * 1e6
        print(f"wrote {args.profile}: {len(actions)} measured actions; simulated makespan {sim.makespan:.0f} us "
              f"vs measured step {measured:.0f} us ({(sim.makespan - measured) / measured * 100:+.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
