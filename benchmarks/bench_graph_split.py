"""What the split on the autograd graph buys and costs: a stage whose weights are not Linears.

    python benchmarks/bench_graph_split.py [--rounds 15] [--steps 2]

The model, one stage in one process: a token embedding of 16,384 x 256 (above the size at which
an embedding table is deferred), four residual MLP blocks whose two layers are a Linear subclass
with its own `forward`, width 256 (as LoRA or quantization wrappers are, which the split matmul does not
take), and a Linear head; 8 sequences of 128 tokens. Three sides run the same model, weights
and batch: the one-rank `1f1b` program (every backward one `B`), `zb1p` with the split on the
graph (the embedding and the subclasses' weight gradients deferred to `W`), and `zb1p` with the
graph split off (only the head's Linear deferred; the rest of the backward in `I`). Sides alternate in each round, each
action timed by the thread's CPU time (one intra-op thread) from the profiled steps. Printed,
medians over rounds: `I / B`, the share of a backward left on the path the stage before waits
for, with the graph split and without it (goal: lower with it), and `(I + W) / B`, what the split
costs in all (a fork's node runs twice; the graph is kept from `I` to `W`); and the gradients of
the sides compared (goal: equal).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

VOCAB, WIDTH, LENGTH, BATCH, LAYERS = 16384, 256, 128, 8, 4


def _model() -> Any:
    import torch

    class Scaled(torch.nn.Linear):
        def forward(self, x: Any) -> Any:
            return torch.nn.functional.linear(x, self.weight, self.bias) * 0.5

    class Stage(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, WIDTH)
            self.ups = torch.nn.ModuleList([Scaled(WIDTH, 4 * WIDTH) for _ in range(LAYERS)])
            self.downs = torch.nn.ModuleList([Scaled(4 * WIDTH, WIDTH) for _ in range(LAYERS)])
            self.head = torch.nn.Linear(WIDTH, 64)

        def forward(self, x: Any) -> Any:
            h = self.embed(x)
            for up, down in zip(self.ups, self.downs):
                h = h + down(torch.nn.functional.gelu(up(h)))
            return self.head(h)

    torch.manual_seed(0)
    return Stage()


def _loss(y: Any, t: Any) -> Any:
    import torch

    return torch.nn.functional.cross_entropy(y.reshape(-1, y.shape[-1]), t.reshape(-1))


def _seconds(timings: dict[str, list[float]], steps: int, kinds: str) -> float:
    return sum(sum(t[-steps:]) for label, t in timings.items() if label.lstrip("0123456789")[:1] in kinds)


def measure(rounds: int, steps: int) -> dict[str, Any]:
    import copy

    import torch

    from ppdsl.expansion import parse
    from ppdsl.runtime import PipelineSchedule
    from ppdsl.runtime.torch_backend import TorchFramework

    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, VOCAB, (BATCH, LENGTH), generator=g)
    t = torch.randint(0, 64, (BATCH, LENGTH), generator=g)
    base = _model()

    class NoGraphSplit(TorchFramework):
        def graph_weights(self, stage: Any, switched: Any) -> list[tuple[str, Any, str]]:
            return []

    sides: dict[str, tuple[Any, Any]] = {}
    for name, program, fw in (("1f1b", "1f1b", "torch"), ("graph", "zb1p", "torch"), ("linears", "zb1p", NoGraphSplit())):
        prog = parse(f"pipeline ranks=1 microbatches=4\nuse {program}()\n", f"<{program}>")
        layer = copy.deepcopy(base)
        with warnings.catch_warnings():  # the Linears-only side says, as it should, that it keeps them in I
            warnings.simplefilter("ignore")
            sides[name] = (PipelineSchedule(prog, [layer], _loss, rank=0, framework=fw, profile=True), layer)

    def step(name: str) -> None:
        sched, layer = sides[name]
        layer.zero_grad(set_to_none=True)
        sched.step(x, target=t)

    out: dict[str, list[float]] = {"I_graph": [], "I_linears": [], "IW_graph": [], "IW_linears": []}
    names = list(sides)
    for r in range(rounds + 1):  # round 0 warms up
        for name in names if r % 2 else reversed(names):
            for _ in range(steps):
                step(name)
        if r:
            b = _seconds(sides["1f1b"][0].timings, steps, "B")
            for side in ("graph", "linears"):
                timings = sides[side][0].timings
                out[f"I_{side}"].append(_seconds(timings, steps, "I") / b)
                out[f"IW_{side}"].append(_seconds(timings, steps, "IW") / b)
    grads = {name: torch.cat([p.grad.reshape(-1) for p in layer.parameters()]) for name, (_, layer) in sides.items()}
    scale = float(grads["1f1b"].abs().max())
    diff = max(float((grads[n] - grads["1f1b"]).abs().max()) / scale for n in ("graph", "linears"))
    return {"medians": {k: statistics.median(v) for k, v in out.items()}, "ranges": out, "diff": diff,
            "paths": sides["graph"][0].split_paths}


def main(argv: list[str] | None = None, emit: Callable[[str], None] = print) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps", type=int, default=2, help="steps of each side per round")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    import ppdsl.runtime.interpreter.schedule as interpreter

    interpreter.time = SimpleNamespace(perf_counter=time.thread_time)  # type: ignore[assignment]
    r = measure(args.rounds, args.steps)
    m = r["medians"]
    emit(f"stage: {r['paths'][0]}")
    emit(f"I / B        graph split {m['I_graph']:.3f}, Linears only {m['I_linears']:.3f}  "
         f"(the backward's share left in I; goal: lower with the graph split)")
    emit(f"(I + W) / B  graph split {m['IW_graph']:.3f}, Linears only {m['IW_linears']:.3f}  (what the split costs in all)")
    emit(f"gradients against 1f1b: {r['diff']:.1e}")
    ok = m["I_graph"] < m["I_linears"] and r["diff"] <= 1e-4
    emit("ok" if ok else "NOT MET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
