"""Step time of zbv against 1F1B on the GPT example (examples/gpt), 4 local ranks on gloo.

    python benchmarks/bench_gpt.py [--rounds 3] [--steps 6]

Both schedules train the same 8-block GPT (examples/gpt/model.py) in the same 4 processes:
one `ppdsl run` launch runs the files 1f1b, zbv, 1f1b, zbv, ... one after another, so machine
noise hits both alike. Each file's step time is rank 0's mean over its steps after the first;
the script prints each side's median over the rounds and the ratio zbv/1f1b.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=6, help="steps per file and round (the first is warm-up)")
    args = p.parse_args()
    from ppdsl.cli.run_cmd import _programs
    from ppdsl.runtime.jobs.launcher import launch
    from ppdsl.runtime.jobs.models import check_contract
    from ppdsl.semantics import CommModel

    sides = {"1f1b": str(ROOT / "schedules" / "1f1b.pps"), "zbv": str(ROOT / "schedules" / "zbv.pps")}
    files = [sides[name] for _ in range(args.rounds) for name in sides]
    programs = _programs(files, CommModel.RENDEZVOUS)
    model, data, loss = check_contract(str(ROOT / "examples" / "gpt" / "model.py"), None, None, "sgd",
                                       [pr.stages for pr in programs])
    argv = [*files, "--steps", str(args.steps), "--model", str(model), "--data", str(data), "--loss", str(loss)]
    outcome = launch(programs, argv, steps=args.steps, timeout=120, quiet=True)
    if outcome.code != 0:
        print(f"benchmark failed: {outcome.failure}", file=sys.stderr)
        return 1
    times: dict[str, list[float]] = {name: [] for name in sides}
    for i in range(len(files)):
        name = list(sides)[i % len(sides)]
        t = outcome.file(i).step_time
        if t:
            times[name].append(t)
    med = {name: statistics.median(v) for name, v in times.items()}
    p0 = programs[0]
    print(f"GPT example (8 blocks, width 32, 32 tokens, batch 16), {p0.ranks} ranks, gloo on loopback; "
          f"{args.rounds} alternating rounds of {args.steps} steps")
    for name, v in times.items():
        print(f"{name:5s} {med[name] * 1e3:8.2f} ms/step  (rounds: {', '.join(f'{t * 1e3:.2f}' for t in v)})")
    print(f"ratio zbv/1f1b: {med['zbv'] / med['1f1b']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
