"""Benchmark: the interpreter's step time in one process, this checkout against another.

    python benchmarks/bench_interpreter.py --base ../other-checkout [--rounds 5] [--framework torch]

A one-rank program needs no process group, so the step loop, the handlers, the local hand-off
between two stages of one rank and the split backward run alone, without the noise of
messages between processes. The model is tiny (two Linear(16, 16) stages), so the step time
is mostly the interpreter's own work per action. Each round runs one process per checkout
(`PYTHONPATH=CHECKOUT`), both at once so that they share the machine's load (two cores: one
each), alternating which starts first; each process imports, builds its schedules and warms
up, then both start measuring together (neither measures while the other imports), and time
`--steps` steps of two programs and print the median step time per program, in the CPU time of
the stepping thread (one intra-op thread: the framework computes on it), which a loaded
machine's preemption does not inflate. Prints every round with its ratio this/base, the medians
over rounds and the median of the rounds' ratios (below 1: this checkout is faster).
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
try:
    from ppdsl.runtime import PipelineSchedule
except ImportError:  # a checkout from before `ppdsl.runtime` exported it lazily
    from ppdsl.runtime.schedule import PipelineSchedule

framework, steps, programs = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
built = {}
for name, text in programs.items():
    program = parse(text)
    if framework == "torch":
        import torch
        torch.manual_seed(0)
        layers = {s: torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh()) for s in range(program.stages)}
        x, y = torch.randn(32, 16), torch.randn(32, 16)
        loss = torch.nn.functional.mse_loss
        zero = (lambda ls: lambda: [l.zero_grad() for l in ls.values()])(layers)
    else:
        import paddle
        paddle.seed(0)
        layers = {s: paddle.nn.Sequential(paddle.nn.Linear(16, 16), paddle.nn.Tanh()) for s in range(program.stages)}
        x, y = paddle.randn([32, 16]), paddle.randn([32, 16])
        loss = paddle.nn.functional.mse_loss
        zero = (lambda ls: lambda: [l.clear_gradients() for l in ls.values()])(layers)
    sched = PipelineSchedule(program, layers, loss, rank=0)
    for _ in range(5):
        zero()
        sched.step(x, target=y)
    built[name] = (sched, zero, x, y)
print("ready", flush=True)
sys.stdin.readline()  # both sides start measuring together
out = {}
for name, (sched, zero, x, y) in built.items():
    times = []
    for step in range(steps):
        zero()
        t0 = time.thread_time()
        sched.step(x, target=y)
        times.append(time.thread_time() - t0)
    sched.close()
    out[name] = statistics.median(times)
print(json.dumps(out))
'''


def start(checkout: Path, framework: str, steps: int) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(checkout), OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-c", CHILD, framework, str(steps), json.dumps(PROGRAMS)],
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def ready(child: subprocess.Popen[str], checkout: Path) -> None:
    """Until the child has imported, built its schedules and warmed up."""
    assert child.stdout is not None
    line = child.stdout.readline()
    if line.strip() != "ready":
        err = child.stderr.read() if child.stderr is not None else ""
        raise SystemExit(f"{checkout}: the benchmark failed:\n{err[-2000:]}")


def finish(child: subprocess.Popen[str], checkout: Path) -> dict[str, float]:
    out, err = child.communicate(timeout=600)
    if child.returncode != 0:
        raise SystemExit(f"{checkout}: the benchmark failed:\n{err[-2000:]}")
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
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
    ratios: dict[str, list[float]] = {name: [] for name in PROGRAMS}
    for r in range(args.rounds):
        # Both sides at once, one core each: a round's two figures share the machine's load, and
        # their ratio is the round's comparison. The first to start alternates.
        order = ["base", "this"] if r % 2 == 0 else ["this", "base"]
        children = {side: start(sides[side], args.framework, args.steps) for side in order}
        for side in order:
            ready(children[side], sides[side])
        for side in order:  # go: the two measure at the same time, neither while the other imports
            stdin = children[side].stdin
            assert stdin is not None
            stdin.write("go\n")
            stdin.flush()
        for side in order:
            for name, t in finish(children[side], sides[side]).items():
                got[side][name].append(t)
        for name in PROGRAMS:
            ratios[name].append(got["this"][name][-1] / got["base"][name][-1])
        print(f"round {r + 1}: " + "; ".join(
            f"{name}: base {got['base'][name][-1] * 1e3:.3f} ms, this {got['this'][name][-1] * 1e3:.3f} ms, "
            f"this/base {ratios[name][-1]:.3f}" for name in PROGRAMS), flush=True)
    for name in PROGRAMS:
        base, this = statistics.median(got["base"][name]), statistics.median(got["this"][name])
        print(f"{name}: median step base {base * 1e3:.3f} ms, this {this * 1e3:.3f} ms; "
              f"median of the rounds' this/base {statistics.median(ratios[name]):.3f}")

if __name__ == "__main__":
    main()
