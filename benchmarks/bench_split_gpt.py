"""What the split backward costs on a real model: (I + W) / B on the torch GPT example, one process.

    python benchmarks/bench_split_gpt.py [--rounds 21] [--steps 3] [--device cpu|cuda] [--settings plain,checkpoint,autocast_bf16]

The model is `examples/torch/gpt/model.py` (8 pre-norm blocks, width 32, 16 sequences of 32
tokens) as one stage, run by the one-rank `zb1p` program and, as its baseline, by the one-rank
`1f1b` program: the same model, weights, batch and forwards, every backward one `B` there and
one `I` plus one `W` here. Settings: `plain`; `checkpoint`, every block under
`torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`; `autocast_bf16`, the step under
`torch.autocast(dtype=torch.bfloat16)`. Sides alternate within each round (`--steps` steps of zb1p, then of 1f1b, the order reversed
every other round), times come from each side's profiled steps (`PipelineSchedule(profile=True)`),
and a round's figure is the sum of its `I` and `W` times over the sum of its `B` times; printed: the
median over rounds per setting (goal <= 1.10), and the gradients of the two sides compared.
Nothing crosses a process here, so the figure is the split's own cost, not the pipeline's.
On the CPU each action is timed by the thread's CPU time (one intra-op thread), so the
machine's other load does not enter the figure; with `--device cuda`, by the wall clock, each
timed action waiting for its kernels; the allocator's peak is printed
beside the bytes the checker predicts from the measured sizes (`gpu_check.py`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from types import SimpleNamespace
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples" / "torch" / "gpt"))

SETTINGS = ("plain", "checkpoint", "autocast_bf16")


def _model(setting: str, stages: int, device: str) -> list[Any]:
    import model as gpt
    import torch
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(torch.nn.Module):
        """A block whose activations are recomputed in its backward (a user's usual wrapper)."""

        def __init__(self, block: torch.nn.Module) -> None:
            super().__init__()
            self.block = block

        def forward(self, x: Any, mask: Any) -> Any:
            return checkpoint(self.block, x, mask, use_reentrant=False)

    torch.manual_seed(0)
    whole = [gpt.build_stage(s, stages) for s in range(stages)]
    if setting == "checkpoint":
        for stage in whole:
            stage.blocks = torch.nn.ModuleList([Checkpointed(b) for b in stage.blocks])
    return [s.to(device) for s in whole]


def _context(setting: str, device: str) -> Any:
    import contextlib

    import torch

    return torch.autocast(device, dtype=torch.bfloat16) if setting == "autocast_bf16" else contextlib.nullcontext()


def _split_seconds(timings: dict[str, list[float]], steps: int) -> tuple[float, float]:
    """(seconds of every I and W, seconds of every B) of the last `steps` steps."""
    split = sum(sum(t[-steps:]) for label, t in timings.items() if _kind(label) in ("I", "W"))
    whole = sum(sum(t[-steps:]) for label, t in timings.items() if _kind(label) == "B")
    return split, whole


def _kind(label: str) -> str:
    """`12I3` -> `I`."""
    return label.lstrip("0123456789")[:1]


def measure(setting: str, rounds: int, device: str, steps: int = 3) -> dict[str, Any]:
    """Per round (I + W) / B, the gradients' largest difference, and the sides' memory."""
    import model as gpt
    import torch

    from ppdsl.expansion import parse
    from ppdsl.memory import Sizes, peak_bytes
    from ppdsl.runtime import PipelineSchedule
    from ppdsl.runtime.jobs.profile import stage_sizes

    x, y = next(gpt.batches(0))
    x, y = x.to(device), y.to(device)
    sides: dict[str, tuple[Any, list[Any]]] = {}
    for name in ("zb1p", "1f1b"):
        program = parse(f"pipeline ranks=1 microbatches=8\nuse {name}()\n", f"<{name}>")
        layers = _model(setting, program.stages, device)
        sides[name] = (PipelineSchedule(program, layers, gpt.loss, rank=0, framework="torch", profile=True), layers)
    context = _context(setting, device)

    def step(name: str) -> None:
        sched, layers = sides[name]
        for layer in layers:
            layer.zero_grad(set_to_none=True)
        with context:
            sched.step(x, target=y)

    ratios = []
    for r in range(rounds + 1):  # round 0 warms up
        order = ("zb1p", "1f1b") if r % 2 else ("1f1b", "zb1p")
        for name in order:
            for _ in range(steps):
                step(name)
        if r:
            split, _ = _split_seconds(sides["zb1p"][0].timings, steps)
            _, whole = _split_seconds(sides["1f1b"][0].timings, steps)
            ratios.append(split / whole)
    grads = {name: torch.cat([p.grad.float().reshape(-1) for layer in layers for p in layer.parameters()])
             for name, (_, layers) in sides.items()}
    diff = float((grads["zb1p"] - grads["1f1b"]).abs().max() / grads["1f1b"].abs().max())
    memory: dict[str, Any] = {}
    for name, (sched, layers) in sides.items():
        sizes = stage_sizes(sched)
        rows = [sizes[s] for s in range(sched.program.stages)]
        predicted = peak_bytes(sched.program, Sizes([r[0] for r in rows], [r[1] for r in rows],
                                                    [r[2] for r in rows])).peak[0]
        memory[name] = {"predicted": predicted, "measured_tensors": sched.memory.peak_bytes}
        if device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            step(name)
            memory[name]["allocator_peak"] = int(torch.cuda.max_memory_allocated())
    return {"setting": setting, "ratios": ratios, "median": statistics.median(ratios), "diff": diff,
            "memory": memory, "paths": sides["zb1p"][0].split_paths}


def tolerance(setting: str) -> float:
    return 1e-2 if setting == "autocast_bf16" else 1e-4  # float32: the two sides sum in other orders


def main(argv: list[str] | None = None, emit: Callable[[str], None] = print) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--steps", type=int, default=3, help="steps of each side per round")
    p.add_argument("--device", default="cpu")
    p.add_argument("--settings", default=",".join(SETTINGS))
    args = p.parse_args(argv)
    import torch

    if args.device == "cpu":
        torch.set_num_threads(1)  # one process, the figure of one core
        # The profile's clock becomes this thread's CPU time: on a shared VM the wall clock of
        # one round moved by +-50% at a load average under 1; CPU time is what the split costs.
        import ppdsl.runtime.interpreter.schedule as interpreter

        interpreter.time = SimpleNamespace(perf_counter=time.thread_time)  # type: ignore[assignment]
    bad = 0
    for setting in args.settings.split(","):
        r = measure(setting, args.rounds, args.device, args.steps)
        ok = r["median"] <= 1.10 and r["diff"] <= tolerance(setting)
        bad += not ok
        emit(f"{setting:14s} (I + W) / B {r['median']:.3f} (rounds {min(r['ratios']):.3f}-{max(r['ratios']):.3f}; "
             f"goal <= 1.10)  gradients zb1p vs 1f1b {r['diff']:.1e}  {'ok' if ok else 'NOT MET'}")
        for name, m in r["memory"].items():
            line = f"{'':14s} {name:5s} predicted peak {m['predicted'] / 2**20:.2f} MiB, tensors kept {m['measured_tensors'] / 2**20:.2f} MiB"
            if "allocator_peak" in m:
                line += f", allocator peak {m['allocator_peak'] / 2**20:.2f} MiB"
            emit(line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
