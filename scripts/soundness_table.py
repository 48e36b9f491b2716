"""Print the soundness table: the checker's verdict against what real gloo does (issue 15).

    python scripts/soundness_table.py            # every case of tests/runtime/test_soundness.py
    python scripts/soundness_table.py --cases    # ...and one line per case

Runs the same cases as the test, on real paddle processes over loopback (2 and 3 ranks),
each unguarded (`PipelineSchedule(check=False, _guard=False)`) and, when it is clean or has
PPS212, with the runtime's label guard (and, when it has batches, once more through the
runtime's NCCL path for batches, which gloo runs member by member). Needs paddle; takes
about a minute.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "runtime" / "helpers"))

import ppdsl  # noqa: E402
import soundness as S  # noqa: E402


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", action="store_true", help="one line per case as well")
    args = parser.parse_args(argv)
    cases = S.cases()
    verdicts = {c.name: S.verdict(ppdsl.parse(c.text)) for c in cases}
    t0 = time.monotonic()
    results = S.run(cases, verdicts)
    seconds = time.monotonic() - t0
    print(S.kinds_table(results, verdicts))
    print()
    print(S.table(results, verdicts))
    if args.cases:
        print()
        print("| case | kind | verdict | run | outcome | step (s) |")
        print("| --- | --- | --- | --- | --- | --- |")
        for r in results:
            step = f"{r.seconds[1]:.3f}" if len(r.seconds) > 1 else "-"
            print(f"| {r.case.name} | {r.case.kind} | {verdicts[r.case.name]} | {r.mode} | {r.outcome} | {step} |")
    bad = S.disagreements(results, verdicts)
    gloo = [r for r in results if r.mode not in S.NCCL_PATH]
    gloo_bad = [r for r in bad if r.mode not in S.NCCL_PATH]
    print(f"\n{len(cases)} programs, {len(results)} runs in {seconds:.0f} s: on the gloo path "
          f"{len(gloo) - len(gloo_bad)}/{len(gloo)} runs agree with the checker; on the NCCL batch path "
          f"{len(results) - len(gloo) - (len(bad) - len(gloo_bad))}/{len(results) - len(gloo)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
