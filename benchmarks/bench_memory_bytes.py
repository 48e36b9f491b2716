"""How close the predicted peak bytes per rank come to what `ppdsl run --profile` measured.

    python benchmarks/bench_memory_bytes.py [--steps 3]

For 1f1b, zb1p, zbv and v_half on `examples/gpt` (8 microbatches) at 2 and 4 local ranks, one
`ppdsl run --profile` each. The profile holds each stage's sizes (bytes a forward keeps alive
until its backward, an `I` until its `W`, and the stage's weights, gradients and optimizer
state) and, per rank, the peak measured over the run (live tensors after every action, and
the state at the end). Prints, per rank, the peak `ppdsl.memory.peak_bytes` predicts from the
sizes next to the measured one, in all and for the activations alone (the state is the same
figure on both sides). Memory is not timing: a loaded machine measures the same bytes.
Goal: within 10%.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = str(ROOT / "examples" / "gpt" / "model.py")
SCHEDULES = ("1f1b", "zb1p", "zbv", "v_half")
FLAGS = ["--model", f"{MODEL}:build_stage", "--data", f"{MODEL}:batches", "--loss", f"{MODEL}:loss",
         "--optimizer", "adam", "--lr", "3e-3"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    args = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from ppdsl.memory import bytes_text

    tmp = Path(tempfile.mkdtemp(prefix="ppdsl-bytes-"))
    worst = worst_act = 0.0
    for ranks in args.ranks:
        for name in SCHEDULES:
            file = tmp / f"{name}{ranks}.pps"
            file.write_text(f"pipeline ranks={ranks} microbatches=8\nuse {name}()\n")
            profile = tmp / f"{name}{ranks}.json"
            cmd = [sys.executable, "-m", "ppdsl", "run", str(file), "--steps", str(args.steps), "-q", "--timeout", "300",
                   "--profile", str(profile), *FLAGS]
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=ROOT, check=False)
            if out.returncode != 0:
                print(f"{name} at {ranks} ranks: ppdsl run failed: {out.stderr.strip()[-400:]}", file=sys.stderr)
                return 1
            for m in json.loads(profile.read_text())["memory"]:
                measured = m["peak_bytes"] + m["state_bytes"]
                predicted = m["predicted_bytes"]
                error = (predicted - measured) / measured * 100
                act_error = (predicted - m["state_bytes"] - m["peak_bytes"]) / m["peak_bytes"] * 100
                worst, worst_act = max(worst, abs(error)), max(worst_act, abs(act_error))
                print(f"{name:7s} {ranks} ranks  rank {m['rank']}  predicted {bytes_text(predicted):>10s}  measured "
                      f"{bytes_text(measured):>10s}  {error:+5.1f}%   activations: predicted "
                      f"{bytes_text(predicted - m['state_bytes']):>10s} measured {bytes_text(m['peak_bytes']):>10s} "
                      f"{act_error:+5.1f}%", flush=True)
    print(f"worst |error|: {worst:.1f}% in all, {worst_act:.1f}% of activations alone  (goal <= 10%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
