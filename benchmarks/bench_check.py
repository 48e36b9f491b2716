"""Benchmark: lint + lower an interleaved 1F1B of 64 ranks x 1024 microbatches x 2 virtual stages.

    python benchmarks/bench_check.py [--ranks 64] [--microbatches 1024] [--repeat 3] [--no-torch]

Times, on the same schedule in the same run:
- ppdsl: check() of the compute-only program (every rule family, rendezvous model, with a
  memory limit so the memory rule runs too), lower() to sends and receives, and check() of
  the lowered program (pairing, order, memory, and a rendezvous run to the end);
- PyTorch (when `torch` is importable): `_validate_schedule` + `_add_send_recv` +
  `_simulate_comms_compute`, the chain PyTorch runs to validate and lower a schedule.
Prints actions/s for each part, the ratio, and the time per action at a quarter of the size,
so linearity is visible. Each repeat parses a fresh program (not timed), so no result is
reused between repeats; `--repeat N` prints the best and the spread (the machine may be
shared). These numbers, not timed tests, back any performance claim.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

try:
    import ppdsl  # noqa: F401
except ImportError:  # run from a checkout without installing: the repository root is next door
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ppdsl.check import check  # noqa: E402
from ppdsl.ir import Kind, Program, actions_of  # noqa: E402
from ppdsl.limits import MAX_ACTIONS  # noqa: E402
from ppdsl.lower import lower  # noqa: E402
from ppdsl.expansion import parse  # noqa: E402

T = TypeVar("T")


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    gc.collect()
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def build(ranks: int, microbatches: int, virtual: int) -> Program:
    # Past what a small file may ask for on purpose: the benchmark times the big program.
    return parse(f"pipeline ranks={ranks} microbatches={microbatches}\nuse interleaved_1f1b(virtual={virtual})\n",
                 steps_limit=MAX_ACTIONS)


def ppdsl_chain(program: Program) -> dict[str, Any]:
    limit = float(program.microbatches * program.stages)  # generous: the rule runs, nothing fires
    diags, t_check = timed(lambda: check(program, "rendezvous", max_memory=limit))
    assert not [d for d in diags if d.is_error], diags[:3]
    lowered, t_lower = timed(lambda: lower(program))
    diags2, t_check2 = timed(lambda: check(lowered, "rendezvous", max_memory=limit))
    assert not [d for d in diags2 if d.is_error], diags2[:3]
    return {"compute": program.action_count, "with_comms": lowered.action_count,
            "check": t_check, "lower": t_lower, "check_lowered": t_check2}


def torch_chain(program: Program) -> float | None:
    try:
        from torch.distributed.pipelining import schedules as ts
    except Exception:  # noqa: BLE001 - torch absent or broken: skip that part
        return None
    kinds = {Kind.F: ts._ComputationType.FORWARD, Kind.B: ts._ComputationType.FULL_BACKWARD,
             Kind.I: ts._ComputationType.BACKWARD_INPUT, Kind.W: ts._ComputationType.BACKWARD_WEIGHT}
    actions: dict[int, list[Any]] = {
        r: [ts._Action(a.stage, kinds[a.kind], a.microbatch) for st in row for a in actions_of(st)]
        for r, row in enumerate(program.rows)}
    placement = program.placement

    def chain() -> None:
        ts._validate_schedule(actions, program.ranks, program.stages, program.microbatches)
        comms = ts._add_send_recv({r: list(v) for r, v in actions.items()}, lambda s: placement[s], program.stages)
        ts._simulate_comms_compute(comms, lambda s: placement[s], program.stages)

    _, t = timed(chain)
    return t


PARTS = ("check", "lower", "check_lowered")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=1024)
    ap.add_argument("--virtual", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="runs of the ppdsl chain at full size (best and spread are printed)")
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()

    quarter = [ppdsl_chain(build(args.ranks, max(1, args.microbatches // 4), args.virtual)) for _ in range(args.repeat)]
    small = {k: min(run[k] for run in quarter) if k in PARTS else quarter[0][k] for k in quarter[0]}
    runs = []
    for _ in range(args.repeat):
        program, t_build = timed(lambda: build(args.ranks, args.microbatches, args.virtual))
        runs.append(ppdsl_chain(program))
    r = {k: min(run[k] for run in runs) if k in PARTS else runs[0][k] for k in runs[0]}
    totals = [sum(run[k] for k in PARTS) for run in runs]
    total = min(totals)
    n_all = r["compute"] + r["with_comms"]
    print(f"schedule: interleaved 1F1B, {args.ranks} ranks x {args.microbatches} microbatches x "
          f"{args.virtual} virtual stages: {r['compute']:,} compute actions, {r['with_comms']:,} with comms "
          f"(generated and parsed in {t_build:.2f} s, not counted)")

    def per_action(run: dict[str, Any], part: str) -> float:
        n = run["compute"] if part == "check" else run["with_comms"]
        return 1e6 * run[part] / n

    labels = {"check": "check (compute-only, all rules)", "lower": "lower", "check_lowered": "check (lowered, all rules)"}
    for part in PARTS:
        n = r["compute"] if part == "check" else r["with_comms"]
        times = [run[part] for run in runs]
        spread = f" (median {statistics.median(times):.3f}, max {max(times):.3f})" if len(times) > 1 else ""
        print(f"ppdsl {labels[part]:32} {r[part]:.3f} s{spread}  {n / r[part]:>10,.0f} actions/s"
              f"{' (out)' if part == 'lower' else ''}  linearity {per_action(small, part):.2f} -> {per_action(r, part):.2f} us/action")
    spread = f" (median {statistics.median(totals):.3f}, max {max(totals):.3f})" if len(totals) > 1 else ""
    s_total = sum(small[k] for k in PARTS)
    s_all = small["compute"] + small["with_comms"]
    print(f"ppdsl total:                           {total:.3f} s{spread}  {n_all / total:,.0f} actions/s")
    print(f"linearity: {1e6 * s_total / s_all:.2f} us/action at {s_all:,} actions, "
          f"{1e6 * total / n_all:.2f} us/action at {n_all:,}")
    if args.no_torch:
        return
    t_torch = torch_chain(program)
    if t_torch is None:
        print("torch not installed: PyTorch comparison skipped")
        return
    print(f"PyTorch _validate_schedule + _add_send_recv + _simulate_comms_compute: {t_torch:.3f} s")
    print(f"ratio: ppdsl is {t_torch / total:.1f}x faster (best run; {t_torch / max(totals):.1f}x against the slowest)")


if __name__ == "__main__":
    main()
