"""What the two-rank step benchmarks (bench_split_backward.py, bench_torch.py) share: the
per-round times of the slower rank, ratios within a round, and the per-action medians of
ppdsl's profiled steps."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any


def parse_options(doc: str, steps: int, rounds: int, extra: list[tuple[str, int, str]]) -> argparse.Namespace:
    """The options every two-rank benchmark takes (rows, steps, rounds, threads, the hidden
    --worker of its ranks), plus `extra` integer options (name, default, help)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=128, help="rows per microbatch (default 128)")
    p.add_argument("--width", type=int, default=768, help="width of each Linear (default 768)")
    for name, default, text in extra:
        p.add_argument(name, type=int, default=default, help=f"{text} (default {default})")
    p.add_argument("--steps", type=int, default=steps, help=f"steps per side and round (default {steps})")
    p.add_argument("--rounds", type=int, default=rounds, help=f"rounds, alternating the sides (default {rounds}: "
                   "the host is noisy)")
    p.add_argument("--threads", type=int, help="intra-op threads per rank (default: cores / 2)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args()


def time_rounds(sides: tuple[str, ...], rounds: int, steps: int, run: Callable[[str], None],
                barrier: Callable[[], None], profiled: dict[str, Any]) -> dict[str, list[float]]:
    """Each side's seconds per step in each round, the sides' order reversed every other round;
    after each round one step of each of `profiled` (ppdsl schedules) with `profile` on, so
    the profile's own work stays out of the timed steps."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(rounds):
        for name in sides if r % 2 == 0 else tuple(reversed(sides)):
            barrier()
            t0 = time.perf_counter()
            for _ in range(steps):
                run(name)
            times[name].append((time.perf_counter() - t0) / steps)
        for name, sched in profiled.items():
            sched.profile = True
            barrier()
            run(name)
            sched.profile = False
    return times


def compare_and_time(sides: tuple[str, ...], steps: dict[str, Callable[[], None]], layers: dict[str, Any],
                     reference: str, rounds: int, per_round: int, barrier: Callable[[], None],
                     profiled: dict[str, Any], whole: Callable[[Any], Any] = lambda g: g
                     ) -> tuple[dict[str, float], dict[str, list[float]]]:
    """One step of every side from the same weights and the largest relative difference of
    each side's gradients (`whole` of each) from `reference`'s, then a warm-up step of each
    and the timed rounds (`time_rounds`): (differences, times)."""
    def run(name: str) -> None:
        steps[name]()
        layers[name].zero_grad(set_to_none=False)

    for name in sides:
        barrier()
        steps[name]()
    ref = [whole(p.grad) for p in layers[reference].parameters()]
    diff = {name: max(float((whole(p.grad) - r).abs().max() / r.abs().max().clamp_min(1e-30))
                      for p, r in zip(layers[name].parameters(), ref)) for name in sides}
    for name in sides:
        layers[name].zero_grad(set_to_none=False)
        run(name)  # warm-up: torch's stages infer shapes and allocate on their first steps
    return diff, time_rounds(sides, rounds, per_round, run, barrier, profiled)


def block_layer(width: int, blocks: int, seed: int) -> Any:
    """The block model's stage: `blocks` x (Linear(`width`) + GELU), float32, drawn from `seed`."""
    import torch

    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers)


def gather_and_end(record: dict[str, Any]) -> None:
    """Every rank's `record` to rank 0, which prints them after `RESULT `; the group ends."""
    import json

    import torch.distributed as dist

    gathered: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, record)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(gathered), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def stage_actions(schedules: dict[str, Any], rank: int) -> dict[str, list[float]]:
    """{"1f1b B": [...], "zb1p I": [...], ...}: the profiled F/B/I/W times of this rank's stage."""
    actions: dict[str, list[float]] = {}
    for name, sched in schedules.items():
        for label, durations in sched.timings.items():
            if label[0] == str(rank) and label[1] in "FBIW" and label[2:].isdigit():
                actions.setdefault(f"{name} {label[1]}", []).extend(durations)
    return actions


def guard_seconds(schedule: Any, step: Callable[[], None], calls: int = 2000) -> float:
    """Seconds one end-of-step check of `schedule`'s guard against lost gradients takes (its
    whole per-step work; the graph walk of the first step is once per run), timed right after
    `step()` (which runs one step of `schedule`), while the step's gradients are there."""
    guard = schedule.grad_guard
    step()
    start = time.perf_counter()
    for _ in range(calls):
        guard.check(0)
    return (time.perf_counter() - start) / calls


class Rounds:
    """The ranks' gathered results: a round's time is the slower rank's."""

    def __init__(self, results: list[dict[str, Any]], sides: tuple[str, ...], rounds: int):
        self.results = results
        self.sides = sides
        self.per = {name: [max(r["times"][name][i] for r in results) for i in range(rounds)] for name in sides}
        self.median = {name: statistics.median(v) for name, v in self.per.items()}
        self.actions = {r["rank"]: {k: statistics.median(v) for k, v in r["actions"].items()} for r in results}
        self.worst_diff = max(max(r["diff"].values()) for r in results)

    def ratio(self, a: str, b: str) -> float:
        """Median over rounds of a / b within the round: load that drifts between rounds cancels."""
        return statistics.median(x / y for x, y in zip(self.per[a], self.per[b]))

    def print_times(self) -> None:
        for name in self.sides:
            rounds = ", ".join(f"{t * 1e3:.1f}" for t in self.per[name])
            print(f"  {name:16s} {self.median[name] * 1e3:9.2f} ms/step  (rounds: {rounds})")
        for stage in sorted(s for s, acts in self.actions.items() if acts):
            print(f"stage {stage}: " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in sorted(self.actions[stage].items())))

    def print_split(self) -> None:
        """(I + W) / B on stage 1 and zb1p / 1f1b: does the split backward pay?"""
        b, i, w = self.actions[1]["1f1b B"], self.actions[1]["zb1p I"], self.actions[1]["zb1p W"]
        print(f"ratio (I + W) / B on stage 1: {(i + w) / b:.3f}  (goal <= 1.10)")
        print(f"ratio zb1p / 1f1b step:       {self.ratio('zb1p', '1f1b'):.3f}  (goal <= 0.97; ratio of medians "
              f"{self.median['zb1p'] / self.median['1f1b']:.3f})")
        print(f"ratio zb1p without the split / 1f1b: {self.ratio('zb1p_unsplit', '1f1b'):.3f}  (the old I/W)")

    def print_guard(self) -> None:
        """The guard against lost gradients: zb1p with and without it, and its own check's time."""
        check = max(r["guard"] for r in self.results)
        print(f"ratio zb1p / zb1p without the gradient guard: {self.ratio('zb1p', 'zb1p_unguarded'):.3f}; the guard's "
              f"check: {check * 1e6:.1f} us a step, {check / self.median['zb1p']:.2%} of zb1p's median step "
              "(goal <= 2%)")

    def print_diff(self) -> None:
        print(f"same gradients after one step (all sides against ppdsl 1f1b): max relative difference "
              f"{self.worst_diff:.1e}")


def run_block_ranks(script: str, program: object, ranks: int, args: argparse.Namespace, sides: tuple[str, ...],
                    timeout: float) -> Rounds | None:
    """`script --worker` with the block model's options on `ranks` local processes (the
    launcher counts them from `program`): their gathered rounds (None: failed, said)."""
    from bench_runtime import run_ranks

    from ppdsl.runtime.jobs.launcher import threads_per_rank

    argv = ["--worker", "--rows", str(args.rows), "--width", str(args.width), "--blocks", str(args.blocks),
            "--steps", str(args.steps), "--rounds", str(args.rounds)]
    results = run_ranks(script, program, argv, timeout=timeout, threads=threads_per_rank(ranks, args.threads)[0])
    return None if results is None else Rounds(results, sides, args.rounds)


def run_wide_linear(script: str, args: argparse.Namespace, sides: tuple[str, ...], timeout: float) -> Rounds | None:
    """`script --worker` on 2 local ranks, each timing `sides` on examples/wide_linear.py (8
    microbatches of --rows rows); the gathered rounds, after printing what ran where."""
    from bench_runtime import run_ranks

    from ppdsl.expansion import parse
    from ppdsl.runtime.jobs.launcher import cores, threads_per_rank
    from ppdsl.runtime.interpreter.preflight import prepare
    from ppdsl.semantics import CommModel

    program = prepare(parse("pipeline ranks=2 microbatches=8\nuse gpipe()\n", "<bench>"), CommModel.RENDEZVOUS)
    threads = threads_per_rank(2, args.threads)[0]
    os.environ["WIDE_LINEAR_WIDTH"] = str(args.width)  # the example's layers, in the ranks started below
    argv = ["--worker", "--rows", str(args.rows), "--width", str(args.width), "--steps", str(args.steps), "--rounds", str(args.rounds)]
    results = run_ranks(script, program, argv, timeout=timeout, threads=threads)
    if results is None:
        return None
    print(f"machine: {cores()} cores; 2 ranks x {threads} intra-op thread(s); model: each rank 2 x Linear({args.width}) + GELU, "
          f"float32, 8 microbatches of {args.rows} rows; {args.rounds} rounds x {args.steps} steps, alternating")
    return Rounds(results, sides, args.rounds)
