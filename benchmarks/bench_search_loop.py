"""The profile -> search -> run loop on examples/gpt, against every named generator that fits.

  python benchmarks/bench_search_loop.py [--ranks 2] [--microbatches 8] [--steps 6] [--rounds 5] [--limit 2MiB]

1. `ppdsl run` a 1f1b and a zb1p file on the GPT example, each with `--profile` (times and each
   stage's bytes): the first measures the fused backward `B`, the second `I` and `W`;
2. chooses a byte limit (default: the median of the named generators' peak bytes under the
   profile's sizes, so several fit and some do not) and prints which named generators fit;
3. `ppdsl search --costs p_1f1b.json --costs p_zb1p.json --max-memory LIMIT -o best.pps` (the shape
   the profiles measured, one stage a rank), and `ppdsl lint` of it in bytes;
4. `ppdsl run` the found file and every fitting named generator in the same processes, the
   files' order reversed every other round, and prints each file's median step and the ratio
   found / best named (the median over rounds of the ratio within a round; goal <= 1.00).
   Where the found order is a named generator's, action for action, it says so: that ratio is
   then two runs of one schedule, the run-to-run spread of the measurement and nothing else.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ppdsl.cost_sources import load_costs  # noqa: E402
from ppdsl.ir import Program  # noqa: E402
from ppdsl.load import load_program  # noqa: E402
from ppdsl.memory import bytes_text, parse_limit  # noqa: E402
from ppdsl.search.byte_limit import ByteLimit  # noqa: E402
from ppdsl.search.named import named_results  # noqa: E402
from ppdsl.syntax.printer import print_program  # noqa: E402

GPT = str(ROOT / "examples" / "gpt")
STEP = re.compile(r"^ppdsl run: (\S+): \d+ steps, loss \S+ -> \S+, ([\d.]+) ms/step$", re.MULTILINE)


def ppdsl(*args: str, timeout: float = 900) -> str:
    """The command's standard output (its progress on standard error is left out)."""
    done = subprocess.run([sys.executable, "-m", "ppdsl", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"ppdsl {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return done.stdout


def actions_in_order(program: Program) -> list[tuple[int, str]]:
    return [(rank, str(action)) for rank, _, action in program.actions()]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--steps", type=int, default=6, help="steps per file and round (default 6)")
    p.add_argument("--rounds", type=int, default=5, help="rounds, the files' order reversed every other (default 5)")
    p.add_argument("--profile-steps", type=int, default=6)
    p.add_argument("--limit", help="bytes a rank, e.g. 2MiB (default: the named generators' median peak)")
    args = p.parse_args()
    P, M = args.ranks, args.microbatches
    work = Path(tempfile.mkdtemp(prefix="ppdsl-loop-"))
    profiles: list[str] = []
    for name in ("1f1b", "zb1p"):
        start = work / f"{name}.pps"
        start.write_text(f"pipeline ranks={P} microbatches={M}\nuse {name}()\n")
        profiles.append(str(work / f"p_{name}.json"))
        print(f"1. ppdsl run {name}.pps --model examples/gpt --steps {args.profile_steps} --profile p_{name}.json")
        print("   " + ppdsl("run", str(start), "--model", GPT, "--steps", str(args.profile_steps), "--profile",
                           profiles[-1], "-q").strip().splitlines()[-3])
    costs = load_costs(profiles[0], 2 * P).merged(load_costs(profiles[1], 2 * P))
    profile = profiles[1]
    costs_args = [a for path in profiles for a in ("--costs", path)]
    assert costs.sizes is not None
    named = []
    for n in named_results(P, M, costs, 2 * P):
        peak = ByteLimit(1.0, costs.sizes).peak(n.program)
        if peak is not None:
            named.append((n, max(peak.peak)))
    limit = parse_limit(args.limit, 1e30).amount if args.limit else statistics.median(b for _, b in named)
    print(f"2. limit {bytes_text(limit)} a rank ({limit:.0f} B); named generators' peak bytes:")
    files: dict[str, Path] = {}
    for n, peak in named:
        fits = peak <= limit * (1 + 1e-9)
        print(f"   {n.name:18s} {n.program.stages} stages  peak {bytes_text(peak):>10s}  {'fits' if fits else '-'}")
        key = f"{n.name}_{n.program.stages}st"
        if fits and key not in files:
            files[key] = work / f"{key}.pps"
            files[key].write_text(print_program(n.program))
    best = work / "best.pps"
    print(f"3. ppdsl search --ranks {P} --microbatches {M} --costs p_1f1b.json --costs p_zb1p.json "
          f"--max-memory {limit:.0f}B -o best.pps")
    print("   " + ppdsl("search", "--ranks", str(P), "--microbatches", str(M), *costs_args, "--max-memory",
                       f"{limit:.0f}B", "-o", str(best)).strip().splitlines()[-1])
    for path in [best, *files.values()]:
        ppdsl("lint", str(path), "--costs", profile, "--max-memory", f"{limit:.0f}B")
    print(f"   the found file and {len(files)} named files pass ppdsl lint --costs p_zb1p.json --max-memory {limit:.0f}B")
    found = actions_in_order(load_program(str(best)))
    same = [key for key, path in files.items() if actions_in_order(load_program(str(path))) == found]
    if same:
        print(f"   the found order is {same[0]}'s, action for action: their ratio below is the measurement's own spread")
    paths = [best, *files.values()]
    runs: list[Path] = []
    for r in range(args.rounds):
        runs.extend(paths if r % 2 == 0 else reversed(paths))
    print(f"4. ppdsl run (one process start-up) {len(runs)} files: {args.rounds} rounds x {len(paths)} files x "
          f"{args.steps} steps")
    out = ppdsl("run", *map(str, runs), "--model", GPT, "--steps", str(args.steps), "-q")
    times: dict[str, list[float]] = {}
    for path, ms in STEP.findall(out):
        times.setdefault(Path(path).stem, []).append(float(ms))
    for name, values in times.items():
        print(f"   {name:24s} {statistics.median(values):9.2f} ms/step  (rounds: {', '.join(f'{v:.1f}' for v in values)})")
    named_names = [k for k in times if k != "best"]
    if not named_names:
        print("no named generator fits the limit")
        return 0
    fastest = min(named_names, key=lambda k: statistics.median(times[k]))
    ratio = statistics.median(f / n for f, n in zip(times["best"], times[fastest]))
    print(f"ratio found / best named ({fastest}): {ratio:.3f}  (goal <= 1.00; ratio of medians "
          f"{statistics.median(times['best']) / statistics.median(times[fastest]):.3f})")
    for key in same:
        twin = statistics.median(f / n for f, n in zip(times["best"], times[key]))
        print(f"the found order is {key}'s: found / {key} {twin:.3f} is the spread between two runs of one schedule")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
