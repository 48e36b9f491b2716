"""Benchmark: reading and printing, each against the way before it, in one process.

    python benchmarks/bench_read_print.py [--repeat 5] [--quick]

Inputs, made first (not timed): ppdsl's `interleaved_1f1b(virtual=2)` at 64 ranks x 1024
microbatches as PyTorch's CSV (262,144 actions), 1F1B at 64 ranks x 4096 microbatches
written out as `.pps` (524,288 actions), and, when torch is installed, the CSV PyTorch 2.13's
ScheduleInterleaved1F1B writes for the first shape (idle cells in every row); `--quick` takes
a quarter of the microbatches.

1. Rows kept as integers (`ir.LazyRows`) against every row made into Action objects first.
   Per input, the `lint` front (read, bound the slots, encode) and the `expand`/`convert` front
   (read, print) run both ways: `integers` as the commands run them; `actions` reads the same
   text, then makes every row's steps and encodes and prints from those.
2. Rows read whole (`syntax.scan.PlainRuns`, the parser's set-aside rows) against the same
   text read word by word (`whole_runs=False`: Lark lexes every run, `TokenReader.codes` cuts
   every word, the printer writes from the integers): `read`, and for `.pps` `expand` (read,
   print). Both sides are checked to give the same program first.

The two sides alternate in every round; CPU time (`time.process_time`), medians over the rounds.
The checker's own time is not in these figures (`benchmarks/bench_check.py`).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench_cli import TORCH_CSV

from ppdsl.encoding import Encoded, read_rows
from ppdsl.formats.torch_csv import read_csv, write_csv
from ppdsl.gcpause import no_gc
from ppdsl.ir import Program
from ppdsl.limits import MAX_ACTIONS
from ppdsl.load import check_slots
from ppdsl.expansion import parse
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
    # (past what a small file may ask for, on purpose)
    gen = parse(f"pipeline ranks=64 microbatches={1024 // div}\nuse interleaved_1f1b(virtual=2)\n",
                steps_limit=MAX_ACTIONS)
    csv_text = write_csv(gen)[0]
    pps_text = print_program(parse(f"pipeline ranks=64 microbatches={4096 // div}\nuse 1f1b()\n",
                                   steps_limit=MAX_ACTIONS))
    inputs: dict[str, tuple[str, Callable[[str, str], Program], Callable[[Program], object]]] = {
        "CSV": (csv_text, read_csv, print_program),
        "explicit .pps": (pps_text, read_pps, print_program),
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
    whole_against_word_by_word(repeat, pps_text, csv_text, torch_csv(1024 // div))
    return 0


def read_pps(text: str, path: str = "in.pps", whole: bool = True) -> Program:
    return parse(text, path, steps_limit=MAX_ACTIONS, whole_runs=whole)


def read_cells(text: str, whole: bool = True) -> Program:
    return read_csv(text, "in.csv", whole_runs=whole)


def torch_csv(microbatches: int) -> str | None:
    """PyTorch's own CSV for the benchmark's shape (its generator and csv.writer), if torch is here."""
    if importlib.util.find_spec("torch") is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "torch.csv"
        subprocess.run([sys.executable, "-c", TORCH_CSV, "64", str(microbatches), "2", str(out)], check=True)
        return out.read_text()


def whole_against_word_by_word(repeat: int, pps_text: str, csv_text: str, from_torch: str | None) -> None:
    def expand(text: str, whole: bool) -> object:
        return print_program(read_pps(text, whole=whole))

    def pps(text: str, whole: bool) -> Program:
        return read_pps(text, whole=whole)

    work: list[tuple[str, str, Callable[[str, bool], Program], Callable[[str, bool], object]]] = [
        ("explicit .pps", pps_text, pps, pps), ("explicit .pps", pps_text, pps, expand),
        ("ppdsl's CSV", csv_text, read_cells, read_cells)]
    if from_torch is not None:
        work.append(("PyTorch's CSV", from_torch, read_cells, read_cells))
    print(f"\nrows read whole against word by word; ratio = word by word / whole"
          + ("" if from_torch is not None else " (torch is not installed: no PyTorch CSV)"))
    for name, text, read, job in work:
        program = read(text, False)
        assert read(text, True) == program, name  # the same program, or the figures mean nothing
        n = program.action_count
        times: dict[bool, list[float]] = {True: [], False: []}
        for r in range(repeat):
            for side in ((True, False) if r % 2 == 0 else (False, True)):
                t0 = time.process_time()
                job(text, side)
                times[side].append(time.process_time() - t0)
        fast, slow = statistics.median(times[True]), statistics.median(times[False])
        what = "expand (read, print)" if job is expand else "read"
        print(f"{name:<14} {what:<21} whole {fast:.3f} s ({n / fast:>10,.0f} actions/s)   "
              f"word by word {slow:.3f} s ({n / slow:>10,.0f} actions/s)   ratio {slow / fast:.2f}x")


if __name__ == "__main__":
    raise SystemExit(main())
