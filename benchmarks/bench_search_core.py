"""Benchmark: CPU seconds of the search's inner loops and of the checker, in process, for two checkouts.

    python benchmarks/bench_search_core.py [--base ../main] [--rounds 3]

Times, as process CPU time (best of 3 each, so a loaded machine moves it less than the wall
clock): 200 replays (`search.replay.replay`) and 200 memory peaks (`search.replay.peaks`) of
one list schedule of 8 ranks x 16 microbatches in a V, 40 list schedules (`search.listsched.run`)
under random policies, and the checker's rules on a compute-only interleaved 1F1B of 64 ranks x
1024 microbatches x 2 stages a rank. With `--base`, each round runs the base checkout and this
one, alternating, each in its own process, and the medians are printed.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
FIGURES = ("replay x200", "peaks x200", "listsched x40", "check 64x1024x2")


def measure() -> list[float]:
    import random
    import time

    from ppdsl.check import check
    from ppdsl.generators import registry
    from ppdsl.ir import Program
    from ppdsl.search.listsched import Policy, default_limits, random_policy, run
    from ppdsl.search.problem import make_problem
    from ppdsl.search.replay import peaks, replay

    def best(f: object, n: int) -> float:
        out = float("inf")
        for _ in range(3):
            t = time.process_time()
            for _ in range(n):
                f()  # type: ignore[operator]
            out = min(out, time.process_time() - t)
        return out

    problem = make_problem(8, 16, 2, 8.0)
    order = run(problem, Policy(default_limits(problem)))
    assert order is not None
    rng = random.Random(1)
    policies = [random_policy(problem, rng) for _ in range(40)]
    built = registry.expand("vpp", 64, 1024, {"virtual": 2})
    return [best(lambda: replay(problem, order.rows), 200), best(lambda: peaks(problem, order.rows), 200),
            best(lambda: [run(problem, p) for p in policies], 1),
            best(lambda: check(Program(64, built.stages, 1024, built.placement, built.rows)), 1)]


def in_child(checkout: Path) -> list[float]:
    code = f"import sys; sys.path.insert(0, {str(checkout)!r}); sys.path.insert(1, {str(HERE / 'benchmarks')!r}); " \
           "import bench_search_core as b; print(*b.measure())"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return [float(x) for x in out.split()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", type=Path, help="another checkout, timed alternately with this one")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    sides = [("this", HERE)] + ([("base", args.base.resolve())] if args.base else [])
    got: dict[str, list[list[float]]] = {name: [] for name, _ in sides}
    for r in range(args.rounds):
        for name, checkout in (sides if r % 2 == 0 else sides[::-1]):
            got[name].append(in_child(checkout))
            print(f"round {r + 1} {name}: " + "  ".join(f"{f} {v:.3f} s" for f, v in zip(FIGURES, got[name][-1])))
    for name, _ in sides:
        medians = [statistics.median(col) for col in zip(*got[name])]
        print(f"median {name}: " + "  ".join(f"{f} {v:.3f} s" for f, v in zip(FIGURES, medians)))


if __name__ == "__main__":
    main()
