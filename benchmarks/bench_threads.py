"""Intra-op threads per local rank: `ppdsl run`'s choice (cores / ranks) against every rank using
every core (Paddle's own default when nothing limits it), at 2 and 4 ranks.

    python benchmarks/bench_threads.py [--repeats 3] [--steps 4]

Each measurement is one `ppdsl run` of `1f1b` with `examples/wide_linear.py` (8 microbatches
of 128 rows); the two settings alternate, `--repeats` times each, and the medians of the
reported ms/step are compared.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = str(ROOT / "examples" / "wide_linear.py")


def step_ms(file: str, threads: int, steps: int) -> float:
    cmd = [sys.executable, "-m", "ppdsl", "run", file, "--steps", str(steps), "-q", "--threads", str(threads),
           "--model", f"{MODEL}:build_stage", "--data", f"{MODEL}:batches", "--loss", f"{MODEL}:loss"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT, check=False)
    m = re.search(r"([0-9.]+) ms/step", out.stdout)
    if out.returncode != 0 or m is None:
        raise SystemExit(f"ppdsl run failed: {out.stderr.strip()[-500:]}")
    return float(m.group(1))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    args = p.parse_args()
    from ppdsl.runtime.jobs.launcher import cores

    n = cores()
    print(f"machine: {n} cores")
    tmp = Path(tempfile.mkdtemp(prefix="ppdsl-threads-"))
    env_saved = os.environ.pop("OMP_NUM_THREADS", None)  # the choice under test, not the caller's
    try:
        for ranks in (2, 4):
            file = tmp / f"1f1b_{ranks}.pps"
            file.write_text(f"pipeline ranks={ranks} microbatches=8\nuse 1f1b()\n")
            chosen = max(1, n // ranks)
            times: dict[int, list[float]] = {n: [], chosen: []} if chosen != n else {n: []}
            for _ in range(args.repeats):
                for threads in times:
                    times[threads].append(step_ms(str(file), threads, args.steps))
            med = {t: statistics.median(v) for t, v in times.items()}
            line = f"{ranks} ranks: every core ({n} threads each) {med[n]:.1f} ms/step " \
                   f"(runs: {', '.join(f'{x:.1f}' for x in times[n])})"
            if chosen != n:
                line += (f"; ppdsl's choice ({chosen} each) {med[chosen]:.1f} ms/step "
                         f"(runs: {', '.join(f'{x:.1f}' for x in times[chosen])}); ratio {med[chosen] / med[n]:.3f}")
            print(line, flush=True)
    finally:
        if env_saved is not None:
            os.environ["OMP_NUM_THREADS"] = env_saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
