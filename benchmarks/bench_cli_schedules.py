"""Benchmark: the command line's chain on PyTorch's other schedules, each at about 262,144 actions.

    python benchmarks/bench_cli_schedules.py [--repeat 3] [--only NAME ...]

`bench_cli.py` times the chain `lint CSV` + `expand --comms CSV -o lowered.pps` + `lint lowered.pps`
on Interleaved1F1B; this does the same on every schedule class PyTorch 2.13 ships, at 64 ranks
and a microbatch count that gives about the same number of compute actions, against PyTorch's
`_validate_schedule` + `_add_send_recv` + `_simulate_comms_compute` on the same actions.

Inputs (written first, not timed): each class's `pipeline_order` (`_get_pipeline_order()` for the
single-stage GPipe and 1F1B), built by real torch on CPU for rank 0's stages with torch's fake
process group of 64 ranks, written as `_dump_csv` writes it. The constructor's last step,
`_prepare_schedule_with_comms` (PyTorch lowering the order for its own runtime, minutes of CPU at
this size, and no part of `pipeline_order`), is skipped.

Each round runs, per schedule, ppdsl's three commands (each with its start-up, the same command
on a two-action file, subtracted, as in `bench_cli.py`) and then PyTorch's chain in its own
process; medians over rounds. PyTorch's chain is given the actions without its stage-only
ones (`_simulate_comms_compute` refuses `REDUCE_GRAD`, which GPipe's order ends each row with);
ppdsl reads the file as written. Where a side cannot go on (PyTorch's simulator cannot place
DualPipeV's `OVERLAP_F_B`, whose stage is -1; ppdsl's lint refuses an order that is wrong) the
reason is printed instead of a time.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cli import BIG, Run, compile_sources, ppdsl_command  # noqa: E402

RANKS = 64
# class -> (stages per rank, microbatches, placement style): about 262,144 compute actions each
# (F and B: 2 per stage and microbatch; F, I and W: 3).
SCHEDULES: dict[str, tuple[int, int, str]] = {
    "ScheduleInterleaved1F1B": (2, 1024, "loop"),
    "ScheduleLoopedBFS": (2, 1024, "loop"),
    "ScheduleInterleavedZeroBubble": (2, 640, "loop"),
    "ScheduleZBVZeroBubble": (2, 640, "v"),
    "ScheduleDualPipeV": (2, 640, "v"),
    "ScheduleGPipe": (1, 2048, "loop"),
    "Schedule1F1B": (1, 2048, "loop"),
}

TORCH_ORDER = r"""
import csv, sys
import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as ts
from torch.testing._internal.distributed.fake_pg import FakeStore
name, ranks, per_rank, mbs, style, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
dist.init_process_group("fake", rank=0, world_size=ranks, store=FakeStore())
ts._PipelineScheduleRuntime._prepare_schedule_with_comms = lambda self, *a, **k: None
n = ranks * per_rank
ids = [0] if per_rank == 1 else [0, n - 1] if style == "v" else [0, ranks]
stages = [PipelineStage(torch.nn.Linear(1, 1), i, n, torch.device("cpu")) for i in ids]
cls = getattr(ts, name)
order = cls(stages[0], mbs)._get_pipeline_order() if per_rank == 1 else cls(stages, mbs).pipeline_order
with open(out, "w", newline="") as f:
    writer = csv.writer(f)
    for rank in range(ranks):
        writer.writerow(order[rank])
"""

TORCH_CHAIN = r"""
import csv, sys, time
from torch.distributed.pipelining import schedules as ts
path, ranks, stages, mbs, style = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
bare = {ts.UNSHARD, ts.RESHARD, ts.REDUCE_GRAD}
with open(path, newline="") as f:
    actions = {r: [a for a in map(ts._Action.from_str, row) if a is None or a.computation_type not in bare]
               for r, row in enumerate(csv.reader(f))}
placement = {s: (s if s < ranks else stages - 1 - s) if style == "v" else s % ranks for s in range(stages)}
t0 = time.perf_counter()
try:
    ts._validate_schedule(actions, ranks, stages, mbs)
    comms = ts._add_send_recv({r: list(v) for r, v in actions.items()}, lambda s: placement[s], stages)
    ts._simulate_comms_compute(comms, lambda s: placement[s], stages)
except Exception as exc:
    print("failed", type(exc).__name__, str(exc)[:120].replace("\n", " "))
    raise SystemExit(0)
print("seconds", time.perf_counter() - t0)
"""


def torch_chain(csv_path: Path, stages: int, mbs: int, style: str) -> float | str:
    """PyTorch's chain on the file's actions, in its own process: seconds, or why it failed."""
    done = subprocess.run([sys.executable, "-c", TORCH_CHAIN, str(csv_path), str(RANKS), str(stages), str(mbs), style],
                          capture_output=True, text=True, check=True)
    head, _, rest = done.stdout.strip().splitlines()[-1].partition(" ")
    return float(rest) if head == "seconds" else rest


def compute_actions(cell: str) -> int:
    """The compute actions in a CSV cell: two in a pair `(0F1;1B0)OVERLAP_F_B`, none in an idle
    cell or a stage-only one (`0REDUCE_GRAD`)."""
    if cell.startswith("("):
        return cell.count(";") + 1
    return 1 if cell[-1:].isdigit() else 0


def first_error(argv: list[str]) -> str | None:
    """None when the command succeeds, else its first diagnostic line."""
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode == 0:
        return None
    return next((line for line in done.stdout.splitlines() if "error[" in line), done.stderr.strip()[:200])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="rounds (default 3); medians are printed")
    ap.add_argument("--only", nargs="+", choices=sorted(SCHEDULES), help="these schedules only")
    args = ap.parse_args()
    names = args.only or list(SCHEDULES)
    ppdsl = ppdsl_command()
    compile_sources()
    with tempfile.TemporaryDirectory(prefix="ppdsl-bench-schedules-") as tmp:
        work = Path(tmp)
        tiny_csv, tiny_pps = work / "tiny.csv", work / "tiny.pps"
        tiny_csv.write_text("0F0,0B0\n")
        tiny_pps.write_text("pipeline ranks=1 microbatches=1\nrank 0: 0F0 0B0\n")
        chains: dict[str, list[tuple[list[str], list[str]]]] = {}
        refused: dict[str, str] = {}
        actions: dict[str, int] = {}
        for name in names:
            per_rank, mbs, style = SCHEDULES[name]
            path, lowered = work / f"{name}.csv", work / f"{name}.lowered.pps"
            subprocess.run([sys.executable, "-c", TORCH_ORDER, name, str(RANKS), str(per_rank), str(mbs), style,
                            str(path)], check=True)
            actions[name] = sum(map(compute_actions, path.read_text().replace("\n", ",").split(",")))
            why = first_error([*ppdsl, "lint", *BIG, str(path)])
            if why is not None:
                refused[name] = why
                continue
            # Past the default limits of a few (262,208 actions for GPipe): --max-steps, as a user would.
            chains[name] = [([*ppdsl, "lint", *BIG, str(path)], [*ppdsl, "lint", *BIG, str(tiny_csv)]),
                            ([*ppdsl, "expand", "--comms", *BIG, str(path), "-o", str(lowered)],
                             [*ppdsl, "expand", "--comms", *BIG, str(tiny_csv), "-o", str(work / "t.pps")]),
                            ([*ppdsl, "lint", *BIG, str(lowered)], [*ppdsl, "lint", *BIG, str(tiny_pps)])]
        ppdsl_s: dict[str, list[float]] = {name: [] for name in chains}
        torch_s: dict[str, list[float]] = {name: [] for name in names}
        torch_failed: dict[str, str] = {}
        print(f"rounds: {args.repeat}; {RANKS} ranks; ppdsl: {ppdsl[0]}", flush=True)
        for round_no in range(args.repeat):
            for name in names:
                per_rank, mbs, style = SCHEDULES[name]
                if name in chains:
                    ppdsl_s[name].append(sum(Run(cmd).wall - Run(empty).wall for cmd, empty in chains[name]))
                if name in torch_failed:
                    continue
                t = torch_chain(work / f"{name}.csv", RANKS * per_rank, mbs, style)
                if isinstance(t, str):
                    torch_failed[name] = t
                else:
                    torch_s[name].append(t)
            print(f"  round {round_no + 1} done", flush=True)

    print(f"\n{'schedule (64 ranks)':<31}{'microbatches':>13}{'actions':>10}{'ppdsl s':>9}{'PyTorch s':>11}{'ratio':>8}")
    for name in names:
        _, mbs, _ = SCHEDULES[name]
        mine = f"{statistics.median(ppdsl_s[name]):.2f}" if ppdsl_s.get(name) else "-"
        theirs = f"{statistics.median(torch_s[name]):.2f}" if torch_s[name] else "-"
        ratio = f"{float(theirs) / float(mine):.1f}x" if mine != "-" and theirs != "-" else "-"
        print(f"{name:<31}{mbs:>13}{actions[name]:>10,}{mine:>9}{theirs:>11}{ratio:>8}")
    for name, why in refused.items():
        print(f"{name}: ppdsl lint refuses PyTorch's order: {why}")
    for name, why in torch_failed.items():
        print(f"{name}: PyTorch's chain fails: {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
