"""How fast is `ppdsl.simulate` on a big schedule, and against PyTorch's simulator?

    python benchmarks/bench_simulate.py [--ranks 64 --microbatches 1024 --virtual 2] [--repeat 3] [--no-torch]

Builds the interleaved 1F1B schedule (`use interleaved_1f1b(virtual=V)`), lowers it with
sends and receives (`ppdsl.lower.lower`, not timed), and times, per communication model:

- `simulate()`: the timeline, makespan, bubble, busy and communication time per rank;
- the full report `ppdsl simulate` prints: the same plus peak memory and the critical path.

With torch importable, PyTorch gets the same compute schedule and lowers it the way a PyTorch
user would, with its own `_add_send_recv` (not timed); `_simulate_comms_compute` on that
plan is timed and the ratios printed. Its time on ppdsl's lowered plan is printed too: the
plan's order changes how many rounds PyTorch's simulator takes.

Every ppdsl time is measured at a quarter of the microbatches as well, so the time per action
shows whether the cost is linear. `--repeat N` runs the ppdsl parts N times and prints the
best and the spread; the machine may be shared, so read the best and the spread together.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    import ppdsl  # noqa: F401
except ImportError:  # run from a checkout without installing: the repository root is next door
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ppdsl import parse  # noqa: E402
from ppdsl.check.context import no_gc  # noqa: E402
from ppdsl.costs import CostModel  # noqa: E402
from ppdsl.ir import Kind, Program, actions_of  # noqa: E402
from ppdsl.limits import MAX_ACTIONS  # noqa: E402
from ppdsl.lower import lower  # noqa: E402
from ppdsl.memory import UNIT  # noqa: E402
from ppdsl.simulate import simulate  # noqa: E402

COSTS = CostModel((("F", 1.0), ("B", 2.0), ("comm", 0.1)))
MODELS = ("buffered", "rendezvous")


def build(ranks: int, microbatches: int, virtual: int) -> Program:
    return parse(f"pipeline ranks={ranks} microbatches={microbatches}\nuse interleaved_1f1b(virtual={virtual})\n",
                 "<bench>", steps_limit=MAX_ACTIONS)  # past a small file's bound on purpose


def seconds(fn: Callable[[], Any], repeat: int = 1) -> list[float]:
    """Wall times of `repeat` runs, each after a full collection (garbage from the last run
    is not charged to the next)."""
    out = []
    for _ in range(repeat):
        gc.collect()
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def full_report(program: Program, model: str) -> None:
    sim = simulate(program, COSTS, model)
    _ = (sim.makespan, sim.bubble_ratio, sim.busy, sim.comm, sim.idle, max(sim.peak_memory), len(sim.critical_path))


def spread(times: list[float]) -> str:
    if len(times) == 1:
        return f"{times[0]:6.3f} s"
    return f"{min(times):6.3f} s (median {statistics.median(times):.3f}, max {max(times):.3f})"


def torch_plans(program: Program, lowered: Program) -> tuple[Any, dict[int, list[Any]], dict[int, list[Any]]] | None:
    """PyTorch's schedules module, its own comm plan for `program`, and `lowered` in its types."""
    try:
        from torch.distributed.pipelining import schedules as ts
    except Exception:  # noqa: BLE001 - torch absent or broken: skip that part
        return None
    kinds = {Kind.F: ts._ComputationType.FORWARD, Kind.B: ts._ComputationType.FULL_BACKWARD,
             Kind.I: ts._ComputationType.BACKWARD_INPUT, Kind.W: ts._ComputationType.BACKWARD_WEIGHT,
             Kind.SEND_F: ts._ComputationType.SEND_F, Kind.RECV_F: ts._ComputationType.RECV_F,
             Kind.SEND_B: ts._ComputationType.SEND_B, Kind.RECV_B: ts._ComputationType.RECV_B}

    def in_torch(p: Program) -> dict[int, list[Any]]:
        return {r: [ts._Action(a.stage, kinds[a.kind], a.microbatch) for st in row for a in actions_of(st)]
                for r, row in enumerate(p.rows)}

    placement = program.placement
    own = ts._add_send_recv(in_torch(program), lambda s: placement[s], program.stages)
    return ts, own, in_torch(lowered)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=1024)
    ap.add_argument("--virtual", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each ppdsl part (best and spread are printed)")
    ap.add_argument("--no-torch", action="store_true", help="skip PyTorch's simulator (~20-30 s at full size)")
    args = ap.parse_args()

    sizes = {"quarter": max(1, args.microbatches // 4), "full": args.microbatches}
    programs = {name: build(args.ranks, mb, args.virtual) for name, mb in sizes.items()}
    with no_gc():
        lowered = {name: lower(p) for name, p in programs.items()}
    full = lowered["full"]
    n = full.action_count
    print(f"schedule: interleaved_1f1b(virtual={args.virtual}), {args.ranks} ranks x {args.microbatches} microbatches: "
          f"{programs['full'].action_count:,} compute actions, {n:,} with communication (lowered by ppdsl, not timed)")

    best: dict[tuple[str, str], float] = {}
    for model in MODELS:
        sim = simulate(full, COSTS, model)
        for part, fn in (("simulate()", simulate), ("full report", full_report)):
            per_action = {}
            for name, program in lowered.items():
                times = seconds(lambda: fn(program, COSTS, model) if fn is simulate else fn(program, model), args.repeat)
                per_action[name] = min(times) / program.action_count
                if name == "full":
                    best[(model, part)] = min(times)
                    shown = spread(times)
            print(f"ppdsl {part:12} ({model:10}): {shown}  {n / best[(model, part)]:>10,.0f} actions/s  "
                  f"linearity {1e6 * per_action['quarter']:.2f} -> {1e6 * per_action['full']:.2f} us/action")
        print(f"    makespan {sim.makespan:g}, bubble {100 * sim.bubble_ratio:.2f}%, completed {sim.completed}, "
              f"peak memory {max(sim.peak_memory):g} ({UNIT}), critical path {len(sim.critical_path)} steps")
    if args.no_torch:
        return 0
    plans = torch_plans(programs["full"], full)
    if plans is None:
        print("torch is not installed: no comparison")
        return 0
    ts, own, ours = plans
    placement = full.placement
    t_own = seconds(lambda: ts._simulate_comms_compute(own, lambda s: placement[s], full.stages))[0]
    t_ours = seconds(lambda: ts._simulate_comms_compute(ours, lambda s: placement[s], full.stages))[0]
    print(f"torch _simulate_comms_compute on its own _add_send_recv plan: {t_own:6.2f} s  {n / t_own:>10,.0f} actions/s")
    print(f"torch _simulate_comms_compute on ppdsl's lowered plan:        {t_ours:6.2f} s")
    for (model, part), t in best.items():
        print(f"ppdsl {part} ({model}) / torch on its own plan: {t / t_own:.3f}  (/ torch on ppdsl's plan: {t / t_ours:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
