"""How close `ppdsl simulate --costs profile.json` comes to the step `ppdsl run` measured.

    python benchmarks/bench_profile_accuracy.py [--steps 8] [--fsdp N]

For 1f1b, zb1p, interleaved_1f1b(virtual=2) and zbv on 2 local ranks (8 microbatches), with
the built-in MLP and with `examples/wide_linear.py` (Linear(768)+GELU), one `ppdsl run
--profile` each; prints the makespan `ppdsl simulate` gives from that profile (the run prints
the same number), the measured step and the error. Goal: within 10%.

With `--fsdp N` (PyTorch): sharded stages instead, N shards of each, with the sharding actions
`--fsdp` places (the simulation is of that program): gpipe on 1 rank (N processes), 1f1b and
zb1p on 2 ranks (2N processes), with the built-in MLP and `examples/torch/gpt`. More processes
than cores time the operating system's scheduler too (the header says how many there are).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = str(ROOT / "examples" / "wide_linear.py")
GPT = str(ROOT / "examples" / "torch" / "gpt" / "model.py")
SCHEDULES = ("1f1b()", "zb1p()", "interleaved_1f1b(virtual=2)", "zbv()")
MODELS = {"built-in MLP": [], "wide_linear": ["--model", f"{MODEL}:build_stage", "--data", f"{MODEL}:batches",
                                              "--loss", f"{MODEL}:loss"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--fsdp", type=int, default=1, metavar="N", help="N shards of every stage (PyTorch's FSDP2)")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ppdsl-accuracy-"))
    worst = 0.0
    models, schedules = MODELS, [(call, 2) for call in SCHEDULES]
    if args.fsdp > 1:
        models = {"built-in MLP": ["--framework", "torch"], "torch gpt": ["--model", GPT]}
        schedules = [("gpipe()", 1), ("1f1b()", 2), ("zb1p()", 2)]
        print(f"--fsdp {args.fsdp}: {os.cpu_count()} cores", flush=True)
    for model, flags in models.items():
        for call, ranks in schedules:
            file = tmp / (call.split("(")[0] + ".pps")
            file.write_text(f"pipeline ranks={ranks} microbatches=8\nuse {call}\n")
            profile = tmp / "profile.json"
            shards = ["--fsdp", str(args.fsdp)] if args.fsdp > 1 else []
            cmd = [sys.executable, "-m", "ppdsl", "run", str(file), "--steps", str(args.steps), "-q",
                   "--profile", str(profile), *shards, *flags]
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT, check=False)
            m = re.search(r"makespan ([0-9.]+) us vs measured step (\d+) us \(([-+0-9.]+)%\)", out.stdout)
            if out.returncode != 0 or m is None:
                print(f"{model} {call}: ppdsl run failed: {out.stderr.strip()[-400:]}", file=sys.stderr)
                return 1
            error = float(m.group(3))
            worst = max(worst, abs(error))
            call = f"{call} x{ranks}" if args.fsdp > 1 else call
            print(f"{model:13s} {call:28s} simulated {float(m.group(1)) / 1e3:9.2f} ms  measured "
                  f"{int(m.group(2)) / 1e3:9.2f} ms  {error:+6.1f}%", flush=True)
    print(f"worst |error|: {worst:.1f}%  (goal <= 10%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
