"""How long a script on ppdsl's Python API takes from launch to exit, against another checkout.

    python benchmarks/bench_api_start.py --base ../main [--rounds 8]

Each round launches `examples/train_loop.py` on 2 local ranks (Paddle, gloo over loopback,
`tests/runtime/schedules/2r_zb_iw.pps`, 2 steps) once with the base checkout's package and
once with this one's, so the two sides share the machine's load, and times the whole launch
on the wall clock. Such a script joins the job itself (`init_from_env`): the figure is mostly
process start-up and joining, which is what it measures. Prints every round, the medians and
the spread of each side, and the ratio this/base.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

# Run in a child with the checkout first on the path, so each side launches its own ranks.
LAUNCH = r"""
import sys, time
root = sys.argv[1]
sys.path.insert(0, root)
from ppdsl.load import load_program
from ppdsl.runtime.jobs.launcher import launch
f = root + "/tests/runtime/schedules/2r_zb_iw.pps"
t = time.monotonic()
out = launch([load_program(f)], [f, "2"], steps=0, timeout=60, quiet=True,
             command=[sys.executable, root + "/examples/train_loop.py"])
if out.code != 0:
    raise SystemExit(f"the launch failed: {out.failure}")
print(time.monotonic() - t)
"""


def seconds(checkout: Path) -> float:
    done = subprocess.run([sys.executable, "-c", LAUNCH, str(checkout)], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=str(checkout)))
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: {done.stderr[-2000:]}")
    return float(done.stdout.split()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, type=Path, help="the other checkout (its directory holds `ppdsl/`)")
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    if not (args.base / "ppdsl" / "__init__.py").is_file():
        ap.error(f"{args.base} holds no ppdsl package")
    base: list[float] = []
    this: list[float] = []
    for n in range(args.rounds):
        base.append(seconds(args.base))
        this.append(seconds(HERE))
        print(f"  round {n + 1}: base {base[-1]:.2f} s, this {this[-1]:.2f} s", flush=True)
    b, t = statistics.median(base), statistics.median(this)
    print(f"launch to exit, 2 ranks: median base {b:.2f} s ({min(base):.2f}-{max(base):.2f}), "
          f"this {t:.2f} s ({min(this):.2f}-{max(this):.2f}), this/base {t / b:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
