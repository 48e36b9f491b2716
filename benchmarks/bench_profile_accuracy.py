"""How close `ppdsl simulate --costs profile.json` comes to the step `ppdsl run` measured.

    python benchmarks/bench_profile_accuracy.py [--steps 8]

For 1f1b, zb1p, interleaved_1f1b(virtual=2) and zbv on 2 local ranks (8 microbatches), with
the built-in MLP and with `examples/wide_linear.py` (Linear(768)+GELU), one `ppdsl run
--profile` each; prints the makespan `ppdsl simulate` gives from that profile (the run prints
the same number), the measured step and the error. Goal: within 10%.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = str(ROOT / "examples" / "wide_linear.py")
SCHEDULES = ("1f1b()", "zb1p()", "interleaved_1f1b(virtual=2)", "zbv()")
MODELS = {"built-in MLP": [], "wide_linear": ["--model", f"{MODEL}:build_stage", "--data", f"{MODEL}:batches",
                                              "--loss", f"{MODEL}:loss"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=8)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ppdsl-accuracy-"))
    worst = 0.0
    for model, flags in MODELS.items():
        for call in SCHEDULES:
            file = tmp / (call.split("(")[0] + ".pps")
            file.write_text(f"pipeline ranks=2 microbatches=8\nuse {call}\n")
            profile = tmp / "profile.json"
            cmd = [sys.executable, "-m", "ppdsl", "run", str(file), "--steps", str(args.steps), "-q",
                   "--profile", str(profile), *flags]
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT, check=False)
            m = re.search(r"makespan ([0-9.]+) us vs measured step (\d+) us \(([-+0-9.]+)%\)", out.stdout)
            if out.returncode != 0 or m is None:
                print(f"{model} {call}: ppdsl run failed: {out.stderr.strip()[-400:]}", file=sys.stderr)
                return 1
            error = float(m.group(3))
            worst = max(worst, abs(error))
            print(f"{model:13s} {call:28s} simulated {float(m.group(1)) / 1e3:9.2f} ms  measured "
                  f"{int(m.group(2)) / 1e3:9.2f} ms  {error:+6.1f}%", flush=True)
    print(f"worst |error|: {worst:.1f}%  (goal <= 10%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
