"""Fuzz every ppdsl command with N inputs made from real schedules; print counts and defects.

  .venv/bin/python scripts/fuzz.py               # 10,000 inputs, seed 0, one worker
  .venv/bin/python scripts/fuzz.py -n 500 --seed 3 --workers 2

Each input runs in-process in a worker under a memory limit; see tests/fuzz/harness.py for
what counts as a defect. Prints a table of outcomes per command, then every defect with a
reproducer; exit 1 when there is one.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fuzz"))

import harness  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", type=int, default=10_000, help="inputs (default 10,000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--wall", type=float, default=harness.WALL_SECONDS, help="seconds before a worker is killed")
    p.add_argument("--memory-mb", type=int, default=harness.MEMORY_BYTES // 2**20)
    args = p.parse_args()
    cases = harness.cases(args.n, args.seed)
    pool = harness.Pool(args.workers, args.memory_mb * 2**20, args.wall)
    counts: Counter[tuple[str, str]] = Counter()
    defects: list[harness.Result] = []
    start = time.monotonic()
    try:
        for done, result in enumerate(pool.run(cases), 1):
            counts[(result.case.command, result.outcome)] += 1
            if result.defect:
                defects.append(result)
                print(f"defect: {result.outcome}: {result.case.reproducer()[:300]}", file=sys.stderr, flush=True)
            if done % 500 == 0:
                print(f"... {done}/{len(cases)} in {time.monotonic() - start:.0f} s, {len(defects)} defects",
                      file=sys.stderr, flush=True)
    finally:
        pool.close()
    outcomes = sorted({o for _, o in counts}, key=lambda o: (o not in harness.OUTCOMES_OK, o))
    width = max(len(c) for c in harness.COMMANDS)
    print(f"{len(cases)} inputs, seed {args.seed}, {time.monotonic() - start:.0f} s")
    print(" " * width + "  " + "  ".join(f"{o:>14}" for o in outcomes) + "           all")
    for command in harness.COMMANDS:
        row = [counts[(command, o)] for o in outcomes]
        print(f"{command:<{width}}  " + "  ".join(f"{n:>14}" for n in row) + f"  {sum(row):>12}")
    total = [sum(counts[(c, o)] for c in harness.COMMANDS) for o in outcomes]
    print(f"{'all':<{width}}  " + "  ".join(f"{n:>14}" for n in total) + f"  {sum(total):>12}")
    print(f"\n{len(defects)} defects")
    seen: set[str] = set()
    for r in defects:
        key = r.outcome + r.detail.strip().splitlines()[-1][:120] if r.detail.strip() else r.outcome
        if key in seen:
            continue
        seen.add(key)
        print(f"- {r.outcome} ({r.seconds:.1f} s): {r.case.reproducer()[:600]}")
        if r.detail:
            print("    " + r.detail.strip().replace("\n", "\n    ")[-900:])
    return 1 if defects else 0


if __name__ == "__main__":
    sys.exit(main())
