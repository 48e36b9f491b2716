"""Benchmark: reading and printing with rows kept as integers (`ir.LazyRows`) against the same
work with every row made into Action objects first (the way before), in one process.

    python benchmarks/bench_read_print.py [--repeat 5] [--quick]

Inputs, made first (not timed): ppdsl's `interleaved_1f1b(virtual=2)` at 64 ranks x 1024
microbatches as PyTorch's CSV (262,144 actions), and 1F1B at 64 ranks x 4096 microbatches
written out as `.pps` (524,288 actions); `--quick` takes a quarter of the microbatches.

Per input, the `lint` front (read, bound the slots, encode) and the `expand`/`convert` front
(read, print) run both ways: `integers` as the commands run them; `actions` reads the same text,
then makes every row's steps (what the readers did before) and encodes and prints from those.
The two sides alternate in every round; CPU time (`time.process_time`), medians over the rounds.
The checker's own time is not in these figures (`benchmarks/bench_check.py`).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from ppdsl.encoding import Encoded, read_rows
from ppdsl.formats.torch_csv import read_csv, write_csv
from ppdsl.gcpause import no_gc
from ppdsl.ir import Program
from ppdsl.load import check_slots
from ppdsl.syntax.parser import parse
from ppdsl.syntax.printer import print_program


def made(program: Program) -> Program:
    """The program with every row made as a tuple of steps (what a reader used to hand over),
    with the collector paused as the readers pause it."""
    with no_gc():
        return program.evolve(rows=tuple(tuple(row) for row in program.rows))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="a quarter of the microbatches, 3 rounds")
    args = ap.parse_args()
    div = 4 if args.quick else 1
    repeat = 3 if args.quick else args.repeat
    gen = parse(f"pipeline ranks=64 microbatches={1024 // div}\nuse interleaved_1f1b(virtual=2)\n")
    csv_text = write_csv(gen)[0]
    pps_text = print_program(parse(f"pipeline ranks=64 microbatches={4096 // div}\nuse 1f1b()\n"))
    inputs: dict[str, tuple[str, Callable[[str, str], Program], Callable[[Program], object]]] = {
        "CSV": (csv_text, read_csv, print_program),
        "explicit .pps": (pps_text, parse, print_program),
    }

    def lint_front(text: str, read: Callable[[str, str], Program], as_actions: bool) -> None:
        p = read(text, "in")
        if as_actions:
            p = made(p)
        check_slots(p, "in")
        Encoded(p, read=read_rows(p))

    def print_front(text: str, read: Callable[[str, str], Program], show: Callable[[Program], object],
                    as_actions: bool) -> None:
        p = read(text, "in")
        show(made(p) if as_actions else p)

    print(f"rounds: {repeat}; CPU seconds, medians; ratio = actions / integers")
    for name, (text, read, show) in inputs.items():
        n = read(text, "in").action_count
        for front in ("lint front (read, slots, encode)", "print front (read, print)"):
            times: dict[bool, list[float]] = {False: [], True: []}
            for r in range(repeat):
                for side in ((False, True) if r % 2 == 0 else (True, False)):
                    t0 = time.process_time()
                    if front.startswith("lint"):
                        lint_front(text, read, side)
                    else:
                        print_front(text, read, show, side)
                    times[side].append(time.process_time() - t0)
            fast, slow = statistics.median(times[False]), statistics.median(times[True])
            print(f"{name:<14} {front:<34} integers {fast:.3f} s ({n / fast:>10,.0f} actions/s)   "
                  f"actions {slow:.3f} s ({n / slow:>10,.0f} actions/s)   ratio {slow / fast:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
