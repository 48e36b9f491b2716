"""Benchmark: lint + lower an interleaved 1F1B of 64 ranks x 1024 microbatches x 2 virtual stages.

    PYTHONPATH=. python benchmarks/bench_check.py [--ranks 64] [--microbatches 1024] [--no-torch]

Times, on the same schedule in the same run:
- ppdsl: check() of the compute-only program (every rule family, rendezvous model, with a
  memory limit so the memory rule runs too), lower() to sends and receives, and check() of
  the lowered program (pairing, order, and a rendezvous run to the end);
- PyTorch (when `torch` is importable): `_validate_schedule` + `_add_send_recv` +
  `_simulate_comms_compute`, the chain PyTorch runs to validate and lower a schedule.
Prints actions/s for each part, the ratio, and the time per action at a quarter of the size,
so linearity is visible. These numbers, not timed tests, back any performance claim.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ppdsl.check import check
from ppdsl.ir import Action, Kind, Program, actions_of
from ppdsl.lower import lower
from ppdsl.syntax.parser import parse

T = TypeVar("T")


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    gc.collect()
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def build(ranks: int, microbatches: int, virtual: int) -> Program:
    return parse(f"pipeline ranks={ranks} microbatches={microbatches}\nuse interleaved_1f1b(virtual={virtual})\n")


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=1024)
    ap.add_argument("--virtual", type=int, default=2)
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()

    small, _ = timed(lambda: build(args.ranks, args.microbatches // 4, args.virtual))
    s = ppdsl_chain(small)
    program, t_build = timed(lambda: build(args.ranks, args.microbatches, args.virtual))
    r = ppdsl_chain(program)
    total = r["check"] + r["lower"] + r["check_lowered"]
    n_all = r["compute"] + r["with_comms"]
    print(f"schedule: interleaved 1F1B, {args.ranks} ranks x {args.microbatches} microbatches x "
          f"{args.virtual} virtual stages: {r['compute']:,} compute actions, {r['with_comms']:,} with comms "
          f"(generated and parsed in {t_build:.2f} s, not counted)")
    print(f"ppdsl check (compute-only, all rules): {r['check']:.3f} s  {r['compute'] / r['check']:,.0f} actions/s")
    print(f"ppdsl lower:                           {r['lower']:.3f} s  {r['with_comms'] / r['lower']:,.0f} actions/s (out)")
    print(f"ppdsl check (lowered, all rules):      {r['check_lowered']:.3f} s  {r['with_comms'] / r['check_lowered']:,.0f} actions/s")
    print(f"ppdsl total:                           {total:.3f} s  {n_all / total:,.0f} actions/s")
    s_total = s["check"] + s["lower"] + s["check_lowered"]
    s_all = s["compute"] + s["with_comms"]
    print(f"linearity: {1e6 * s_total / s_all:.2f} us/action at {s_all:,} actions, "
          f"{1e6 * total / n_all:.2f} us/action at {n_all:,}")
    if args.no_torch:
        return
    t_torch = torch_chain(program)
    if t_torch is None:
        print("torch not installed: PyTorch comparison skipped")
        return
    print(f"PyTorch _validate_schedule + _add_send_recv + _simulate_comms_compute: {t_torch:.3f} s")
    print(f"ratio: ppdsl is {t_torch / total:.1f}x faster")


if __name__ == "__main__":
    main()
