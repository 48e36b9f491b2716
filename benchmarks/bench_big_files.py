"""Benchmark: two-line generator files of 262,144 and 1,048,576 steps through the commands.

    python benchmarks/bench_big_files.py [--repeat 3]

Each figure is the installed `ppdsl` command in a child process, as a user runs it; the median
over the rounds of the wall clock and of the child's own CPU time (os.wait4) is printed. The
files are `pipeline ranks=64 microbatches=1024` and `pipeline ranks=128 microbatches=2048`, each
with `use interleaved_1f1b(virtual=2)`. The million passes `--max-steps 1048576`, the number its
message gives (the defaults are 500,000 steps, `show` 262,144).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FILES = {"quarter": (64, 1024), "million": (128, 2048)}
COMMANDS = [
    ("quarter", ["lint"]), ("quarter", ["simulate"]), ("quarter", ["show", "--no-color"]),
    ("quarter", ["show", "--html", "{dir}/q.html"]),
    ("million", ["lint", "--max-steps", "1048576"]), ("million", ["simulate", "--max-steps", "1048576"]),
    ("million", ["show", "--no-color", "--max-steps", "1048576"]),
]


def run_once(argv: list[str]) -> tuple[float, float]:
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    ppdsl = str(Path(sys.executable).with_name("ppdsl"))
    with tempfile.TemporaryDirectory() as work:
        for name, (ranks, mbs) in FILES.items():
            Path(work, f"{name}.pps").write_text(f"pipeline ranks={ranks} microbatches={mbs}\n"
                                                 "use interleaved_1f1b(virtual=2)\n")
        times: dict[str, list[tuple[float, float]]] = {}
        for _ in range(args.repeat):
            for name, command in COMMANDS:
                argv = [ppdsl, command[0], f"{work}/{name}.pps", *(c.format(dir=work) for c in command[1:])]
                times.setdefault(f"{name}: ppdsl {' '.join(command)}", []).append(run_once(argv))
    print(f"medians of {args.repeat} runs (wall / CPU seconds)")
    for label, runs in times.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"  {label.replace('{dir}/', ''):60} {wall:6.2f} / {cpu:6.2f}")


if __name__ == "__main__":
    main()
