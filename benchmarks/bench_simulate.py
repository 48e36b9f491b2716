"""How fast is `ppdsl.simulate` on a big schedule, and against PyTorch's simulator?

    PYTHONPATH=. python benchmarks/bench_simulate.py [--ranks 64 --microbatches 1024 --virtual 2] [--no-torch]

Builds the interleaved 1F1B schedule (`use interleaved_1f1b(virtual=V)`), lowers it with
sends and receives (`ppdsl.lower.lower`), and times `simulate()` (the timeline, makespan,
bubble), then the rest of a full report (peak memory, critical path). With torch importable,
it also times `torch.distributed.pipelining.schedules._simulate_comms_compute` on the same
actions and prints the ratio. Both simulators are run once: at this size noise is small.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ppdsl import parse  # noqa: E402
from ppdsl.costs import CostModel  # noqa: E402
from ppdsl.ir import Program, actions_of  # noqa: E402
from ppdsl.simulate import simulate  # noqa: E402


def build(ranks: int, microbatches: int, virtual: int) -> Program:
    from ppdsl.lower import lower

    program = parse(f"pipeline ranks={ranks} microbatches={microbatches}\nuse interleaved_1f1b(virtual={virtual})\n",
                    "<bench>")
    return lower(program)


def torch_seconds(program: Program) -> float | None:
    try:
        from torch.distributed.pipelining import schedules as ts
    except ImportError:
        return None
    kinds = {k.name: k for k in ts._ComputationType}
    names = {"B": "FULL_BACKWARD", "F": "FORWARD", "I": "BACKWARD_INPUT", "W": "BACKWARD_WEIGHT"}
    order = {r: [ts._Action(a.stage, kinds[names.get(a.kind.name, a.kind.name)], a.microbatch)
                 for step in row for a in actions_of(step)]
             for r, row in enumerate(program.rows)}
    placement = program.placement
    t = time.perf_counter()
    ts._simulate_comms_compute(order, lambda s: placement[s], program.stages)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=1024)
    ap.add_argument("--virtual", type=int, default=2)
    ap.add_argument("--no-torch", action="store_true", help="skip PyTorch's simulator (~16 s at full size)")
    args = ap.parse_args()

    t = time.perf_counter()
    program = build(args.ranks, args.microbatches, args.virtual)
    print(f"schedule: interleaved_1f1b(virtual={args.virtual}), {args.ranks} ranks x {args.microbatches} microbatches, "
          f"{program.action_count} actions with communication (built and lowered in {time.perf_counter() - t:.2f} s)")
    costs = CostModel((("F", 1.0), ("B", 2.0), ("comm", 0.1)))
    results = {}
    for model in ("buffered", "rendezvous"):
        t = time.perf_counter()
        sim = simulate(program, costs, model)
        core = time.perf_counter() - t
        t = time.perf_counter()
        peak = max(sim.peak_memory)
        path = len(sim.critical_path)
        extra = time.perf_counter() - t
        results[model] = core
        print(f"ppdsl simulate ({model:10}): {core:6.2f} s  makespan {sim.makespan:g}, bubble {100 * sim.bubble_ratio:.2f}%, "
              f"completed {sim.completed}; + {extra:.2f} s for peak memory ({peak:g}) and critical path ({path} steps)")
    if args.no_torch:
        return 0
    torch_t = torch_seconds(program)
    if torch_t is None:
        print("torch is not installed: no comparison")
        return 0
    print(f"torch _simulate_comms_compute:  {torch_t:6.2f} s")
    for model, core in results.items():
        print(f"ratio ppdsl ({model}) / torch: {core / torch_t:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
