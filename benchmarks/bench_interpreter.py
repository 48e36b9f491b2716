"""Benchmark: the interpreter's step time in one process, this checkout against another.

    python benchmarks/bench_interpreter.py --base ../other-checkout [--rounds 5] [--framework torch]

A one-rank program needs no process group, so the step loop, the handlers, the local hand-off
between two stages of one rank and the split backward run alone, without the noise of
messages between processes. The model is tiny (two Linear(16, 16) stages), so the step time
is mostly the interpreter's own work per action. Each round runs one process per checkout
(`PYTHONPATH=CHECKOUT`), alternating which goes first; each process times `--steps` steps of
two programs after a warm-up and prints the median step time per program. Prints every
round, the medians over rounds and the ratio this/base (below 1: this checkout is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
PROGRAMS = {
    "interleaved (2 stages, 1 rank)": "pipeline ranks=1 microbatches=8\nuse interleaved_1f1b(virtual=2)\n",
    "zb1p (F, I, W)": "pipeline ranks=1 microbatches=8\nuse zb1p()\n",
}

CHILD = r'''
import json, statistics, sys, time
from ppdsl.load import parse
from ppdsl.runtime.interpreter.schedule import PipelineSchedule

framework, steps, programs = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
out = {}
for name, text in programs.items():
    program = parse(text)
    if framework == "torch":
        import torch
        torch.manual_seed(0)
        layers = {s: torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh()) for s in range(program.stages)}
        x, y = torch.randn(32, 16), torch.randn(32, 16)
        loss = torch.nn.functional.mse_loss
        zero = lambda: [l.zero_grad() for l in layers.values()]
    else:
        import paddle
        paddle.seed(0)
        layers = {s: paddle.nn.Sequential(paddle.nn.Linear(16, 16), paddle.nn.Tanh()) for s in range(program.stages)}
        x, y = paddle.randn([32, 16]), paddle.randn([32, 16])
        loss = paddle.nn.functional.mse_loss
        zero = lambda: [l.clear_gradients() for l in layers.values()]
    sched = PipelineSchedule(program, layers, loss, rank=0)
    times = []
    for step in range(steps + 5):
        zero()
        t0 = time.perf_counter()
        sched.step(x, target=y)
        if step >= 5:
            times.append(time.perf_counter() - t0)
    sched.close()
    out[name] = statistics.median(times)
print(json.dumps(out))
'''


def run(checkout: Path, framework: str, steps: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(checkout), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", CHILD, framework, str(steps), json.dumps(PROGRAMS)],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: the benchmark failed:\n{done.stderr[-2000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, type=Path, help="the other checkout (its directory holds `ppdsl/`)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--framework", choices=("torch", "paddle"), default="torch")
    args = parser.parse_args()
    sides = {"base": args.base.resolve(), "this": HERE}
    got: dict[str, dict[str, list[float]]] = {side: {name: [] for name in PROGRAMS} for side in sides}
    for r in range(args.rounds):
        order = ["base", "this"] if r % 2 == 0 else ["this", "base"]
        for side in order:
            for name, t in run(sides[side], args.framework, args.steps).items():
                got[side][name].append(t)
        print(f"round {r + 1}: " + "; ".join(
            f"{name}: base {got['base'][name][-1] * 1e3:.3f} ms, this {got['this'][name][-1] * 1e3:.3f} ms"
            for name in PROGRAMS), flush=True)
    for name in PROGRAMS:
        base, this = statistics.median(got["base"][name]), statistics.median(got["this"][name])
        print(f"{name}: median step base {base * 1e3:.3f} ms, this {this * 1e3:.3f} ms, this/base {this / base:.3f}")


if __name__ == "__main__":
    main()
