"""Benchmark: one `ppdsl` command run by two checkouts of ppdsl, alternating, on the same file.

    python benchmarks/bench_versions.py --base ../main [--rounds 7] [--wall] -- lint i1f1b.csv

Each round runs the command once with the base checkout's package first on the path
(`PYTHONPATH=BASE python -m ppdsl ...`) and once with this checkout's (the one holding this
script), so the two sides share the machine's load; a child's CPU time comes from
`os.wait4`. Prints every round, the medians, and the ratio this/base (below 1: this checkout
is faster). Start-up is in both sides alike; the command's output is discarded. What a change
costs or saves at the command line is measured this way, against the branch it leaves.
`--wall` measures the wall clock instead, for commands that wait (`ppdsl run`, whose ranks
are other processes and wait for each other).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def seconds(checkout: Path, command: list[str], wall: bool) -> float:
    """The command's CPU time (its own, from `os.wait4`) or, with `wall`, its wall clock."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    t0 = time.monotonic()
    child = subprocess.Popen([sys.executable, "-m", "ppdsl", *command], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    err = child.stderr.read().decode() if child.stderr else ""
    if os.waitstatus_to_exitcode(status) not in (0, 1):  # 1: the checker found problems, still a run
        raise SystemExit(f"{checkout}: ppdsl {' '.join(command)} failed:\n{err[:2000]}")
    return time.monotonic() - t0 if wall else usage.ru_utime + usage.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, type=Path, help="the other checkout (its directory holds `ppdsl/`)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--wall", action="store_true", help="time the wall clock, not the command's CPU time")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="the ppdsl command, after `--`")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the ppdsl command after `--`")
    if not (args.base / "ppdsl" / "__init__.py").is_file():
        ap.error(f"{args.base} holds no ppdsl package")
    base: list[float] = []
    this: list[float] = []
    for n in range(args.rounds):
        base.append(seconds(args.base, command, args.wall))
        this.append(seconds(HERE, command, args.wall))
        print(f"  round {n + 1}: base {base[-1]:.2f} s, this {this[-1]:.2f} s", flush=True)
    b, t = statistics.median(base), statistics.median(this)
    what = "wall clock" if args.wall else "CPU"
    print(f"ppdsl {' '.join(command)}: median {what} base {b:.2f} s, this {t:.2f} s, this/base {t / b:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
