"""Recompute and offload as actions, measured against their predictions.

    python benchmarks/bench_memory_actions.py [--rounds 3] [--steps 4] [--framework torch]

On 2 local ranks, 8 microbatches: 1F1B, 1F1B with `recompute=all` and with `offload=all`, on
the built-in model and on the GPT of `examples/` (`examples/torch/gpt` on PyTorch,
`examples/gpt` on Paddle), each run once per round with `ppdsl run --profile`, the schedules
alternating (their order reversed every other round). Per run:

- the peak activation bytes of each rank, measured (live tensors after every action, autograd's
  saved tensors of the graphs on the device included) against what `ppdsl.memory.peak_bytes`
  predicts from the profile's sizes;
- the step time measured against `ppdsl simulate FILE --costs PROFILE` (the profile of the
  same run: a forward, a recompute, an offload each at its measured mean).

Prints every run, then per model and schedule the medians over the rounds: activations
(rank 0 and rank 1: predicted / measured), step time (simulated / measured), and the measured
step and peak against 1F1B's of the same round. Memory is not timing: a loaded machine
measures the same bytes; the times are a shared machine's, hence the rounds and medians.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCHEDULES = ("1f1b()", "1f1b(recompute=all)", "1f1b(offload=all)")
GPT = {"torch": ROOT / "examples" / "torch" / "gpt" / "model.py", "paddle": ROOT / "examples" / "gpt" / "model.py"}
_STEP = re.compile(r"makespan ([\d.e+]+) us vs measured step ([\d.e+]+) us")


def run_once(framework: str, model: str, schedule: str, steps: int, tmp: Path) -> dict[str, object]:
    """One `ppdsl run --profile`: per rank (predicted, measured) activation bytes, and
    (simulated, measured) step time in microseconds."""
    name = re.sub(r"\W+", "_", f"{model}_{schedule}")
    file = tmp / f"{name}.pps"
    file.write_text(f"pipeline ranks=2 microbatches=8\nuse {schedule}\n")
    profile = tmp / f"{name}.json"
    flags = ["--framework", framework]
    if model == "gpt":
        path = GPT[framework]
        flags = ["--model", f"{path}:build_stage", "--data", f"{path}:batches", "--loss", f"{path}:loss"]
    cmd = [sys.executable, "-m", "ppdsl", "run", str(file), "--steps", str(steps), "--timeout", "300", "-q",
           "--profile", str(profile), *flags]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=ROOT, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{model} {schedule}: ppdsl run failed: {out.stderr.strip()[-600:]}")
    found = _STEP.search(out.stdout + out.stderr)
    if found is None:
        raise RuntimeError(f"{model} {schedule}: no simulated step in ppdsl run's report")
    memory = json.loads(profile.read_text())["memory"]
    acts = {m["rank"]: (m["predicted_bytes"] - m["state_bytes"], m["peak_bytes"]) for m in memory}
    return {"acts": acts, "sim": float(found.group(1)), "step": float(found.group(2))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--framework", choices=("torch", "paddle"), default="torch")
    p.add_argument("--models", nargs="+", choices=("built-in", "gpt"), default=["built-in", "gpt"])
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ppdsl-memory-actions-"))
    results: dict[tuple[str, str], list[dict[str, object]]] = {}
    for r in range(args.rounds):
        for model in args.models:
            for schedule in SCHEDULES if r % 2 == 0 else tuple(reversed(SCHEDULES)):
                res = run_once(args.framework, model, schedule, args.steps, tmp)
                results.setdefault((model, schedule), []).append(res)
                acts = res["acts"]
                assert isinstance(acts, dict)
                said = "  ".join(f"rank {rank} {pred / 1024:7.1f}/{meas / 1024:7.1f} KiB"
                                 for rank, (pred, meas) in sorted(acts.items()))
                print(f"round {r + 1} {model:8s} {schedule:20s} activations predicted/measured: {said}  step "
                      f"simulated/measured {res['sim'] / 1e3:7.2f}/{res['step'] / 1e3:7.2f} ms", flush=True)
    print(f"\nmedians over {args.rounds} rounds ({args.framework}, 2 ranks, 8 microbatches):")
    worst_mem = worst_time = 0.0
    for model in args.models:
        base = results[(model, SCHEDULES[0])]
        for schedule in SCHEDULES:
            runs = results[(model, schedule)]
            errors = []
            for rank in (0, 1):
                pred = statistics.median(float(run["acts"][rank][0]) for run in runs)  # type: ignore[index]
                meas = statistics.median(float(run["acts"][rank][1]) for run in runs)  # type: ignore[index]
                errors.append((pred, meas, (pred - meas) / meas * 100))
            time_err = statistics.median((float(run["sim"]) - float(run["step"])) / float(run["step"]) * 100  # type: ignore[arg-type]
                                         for run in runs)
            step_ratio = statistics.median(float(run["step"]) / float(b["step"]) for run, b in zip(runs, base))  # type: ignore[arg-type]
            peak_ratio = max(e[1] for e in errors) / max(
                statistics.median(float(b["acts"][rank][1]) for b in base) for rank in (0, 1))  # type: ignore[index]
            worst_mem = max([worst_mem, *(abs(e[2]) for e in errors)])
            worst_time = max(worst_time, abs(time_err))
            mem = "  ".join(f"rank {rank} {pred / 1024:.1f}/{meas / 1024:.1f} KiB ({err:+.1f}%)"
                            for rank, (pred, meas, err) in enumerate(errors))
            print(f"{model:8s} {schedule:20s} activations {mem}; step simulated vs measured {time_err:+.1f}%; "
                  f"vs 1F1B: step x{step_ratio:.2f}, peak x{peak_ratio:.2f}")
    print(f"worst |error|: activations {worst_mem:.1f}%, step {worst_time:.1f}%  (goal <= 10%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
