"""Benchmark: the speed a user sees at the command line, each figure measured through `ppdsl`.

    python benchmarks/bench_cli.py [--repeat 3] [--no-torch] [--quick]

Every ppdsl figure is a subprocess running the installed `ppdsl` command (the one beside this
Python), as a user runs it; its start-up (interpreter, imports, argument parsing, the grammar)
is measured by the same command on a two-action file in the same round and subtracted. Each
round runs every command once and then PyTorch's chain once, so the two sides alternate and
share the machine's load; medians over rounds are printed, with the spread. Each child's own
CPU time (from `os.wait4`) is printed beside the wall clock: on a shared machine the wall clock
also counts the time other processes held the cores.

Inputs, written to a temporary directory first (not timed):
- `i1f1b.csv`: the schedule PyTorch 2.13 generates for Interleaved1F1B at 64 ranks x 1024
  microbatches x 2 stages per rank (262,144 compute actions), from PyTorch's own
  `_calculate_single_rank_operations` and `csv.writer` as `_dump_csv` writes it. Without torch,
  ppdsl's `interleaved_1f1b(virtual=2)` written by `ppdsl convert` stands in (said so).
- `explicit.pps`: 1F1B at 64 ranks x 4096 microbatches written out (524,288 one-token actions).
- the same at a quarter of the microbatches, so the time per action shows whether growth is linear.
- `order.csv` (with torch only): the same schedule as the schedule object itself holds it,
  `ScheduleInterleaved1F1B(stages, 1024).pipeline_order`, built by real torch on CPU with
  torch's fake process group of 64 ranks (its `__init__` also lowers it, untimed: 1.5-2 min
  of CPU), written by `csv.writer` as `_dump_csv` writes it; whether it is byte-identical to
  `i1f1b.csv` is printed. PyTorch's chain on it is timed in every round too.

Figures (goals from issue 13):
- `ppdsl lint i1f1b.csv`: actions/s (>= 500k);
- `ppdsl expand explicit.pps`: actions/s (>= 1M);
- the chain `lint i1f1b.csv` + `expand --comms i1f1b.csv -o lowered.pps` + `lint lowered.pps`
  against PyTorch's `_validate_schedule` + `_add_send_recv` + `_simulate_comms_compute` on the
  same schedule (>= 12x), and the same on `order.csv` (>= 10x); PyTorch runs in its own process from the actions in memory (the CSV is
  read before its clock starts), ppdsl from the files;
- `ppdsl lint lowered.pps`: actions/s (>= 1M);
- peak resident memory of `ppdsl lint lowered.pps` (< 400 MB), from the child's rusage.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RANKS, MICROBATCHES, VIRTUAL, EXPLICIT_MICROBATCHES = 64, 1024, 2, 4096
BIG = ["--max-steps", "20000000"]

# PyTorch's generator, called without a process group: `_calculate_single_rank_operations`
# reads only the attributes set here (see ScheduleInterleaved1F1B.__init__ in torch 2.13).
TORCH_CSV = r"""
import csv, sys
from torch.distributed.pipelining import schedules as ts
ranks, mbs, virtual, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
s = ts.ScheduleInterleaved1F1B.__new__(ts.ScheduleInterleaved1F1B)
s.pp_group_size, s.n_local_stages, s._n_microbatches = ranks, virtual, mbs
s.number_of_rounds = max(1, mbs // ranks)
s.microbatches_per_round = mbs // s.number_of_rounds
with open(out, "w", newline="") as f:
    writer = csv.writer(f)
    for rank in range(ranks):
        writer.writerow(s._calculate_single_rank_operations(rank))
"""

# The schedule object's own order: ScheduleInterleaved1F1B built for real (two PipelineStages
# of rank 0 on torch's fake process group), its `pipeline_order` written as `_dump_csv` does.
TORCH_ORDER_CSV = r"""
import csv, sys
import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as ts
from torch.testing._internal.distributed.fake_pg import FakeStore
ranks, mbs, virtual, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
dist.init_process_group("fake", rank=0, world_size=ranks, store=FakeStore())
stages = [PipelineStage(torch.nn.Linear(1, 1), v * ranks, ranks * virtual, torch.device("cpu")) for v in range(virtual)]
schedule = ts.ScheduleInterleaved1F1B(stages, mbs)
with open(out, "w", newline="") as f:
    writer = csv.writer(f)
    for rank in range(ranks):
        writer.writerow(schedule.pipeline_order[rank])
"""

# PyTorch's chain on the CSV's actions, timed inside its own process.
TORCH_CHAIN = r"""
import csv, sys, time
from torch.distributed.pipelining import schedules as ts
path, ranks, stages, mbs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
with open(path, newline="") as f:
    actions = {r: [ts._Action.from_str(c) for c in row] for r, row in enumerate(csv.reader(f))}
placement = {s: s % ranks for s in range(stages)}
t0, c0 = time.perf_counter(), time.process_time()
ts._validate_schedule(actions, ranks, stages, mbs)
comms = ts._add_send_recv({r: list(v) for r, v in actions.items()}, lambda s: placement[s], stages)
ts._simulate_comms_compute(comms, lambda s: placement[s], stages)
print(time.perf_counter() - t0, time.process_time() - c0)
"""


def run_torch_chain(csv_path: Path) -> tuple[float, float]:
    """PyTorch's chain on the schedule in `csv_path`, in its own process: wall and cpu seconds."""
    done = subprocess.run([sys.executable, "-c", TORCH_CHAIN, str(csv_path), str(RANKS), str(RANKS * VIRTUAL),
                           str(MICROBATCHES)], capture_output=True, text=True, check=True)
    wall, cpu = done.stdout.split()[-2:]
    return float(wall), float(cpu)


def ppdsl_command() -> list[str]:
    beside = Path(sys.executable).with_name("ppdsl")
    found = str(beside) if beside.exists() else shutil.which("ppdsl")
    if found is None:
        raise SystemExit("no `ppdsl` command: install ppdsl (pip install -e .) into this Python's environment")
    return [found]


class Run:
    """One child process: wall seconds, its own CPU seconds, its peak resident set in MB."""

    def __init__(self, argv: list[str], stdout: int | None = subprocess.DEVNULL):
        t0 = time.perf_counter()
        child = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(child.pid, 0)
        self.wall = time.perf_counter() - t0
        child.returncode = os.waitstatus_to_exitcode(status)
        err = child.stderr.read().decode() if child.stderr else ""
        if child.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {child.returncode}:\n{err[:2000]}")
        self.cpu = usage.ru_utime + usage.ru_stime
        # ru_maxrss is the larger of this child's peak and this (small) process's size at fork.
        self.rss_mb = usage.ru_maxrss / 1024


def make_inputs(work: Path, divisor: int, use_torch: bool) -> tuple[Path, Path, str]:
    ppdsl = ppdsl_command()
    compile_sources()
    mbs = MICROBATCHES // divisor
    csv_path = work / f"i1f1b_{divisor}.csv"
    origin = "PyTorch 2.13's ScheduleInterleaved1F1B"
    if use_torch:
        subprocess.run([sys.executable, "-c", TORCH_CSV, str(RANKS), str(mbs), str(VIRTUAL), str(csv_path)], check=True)
    else:
        gen = work / f"gen_{divisor}.pps"
        gen.write_text(f"pipeline ranks={RANKS} microbatches={mbs}\nuse interleaved_1f1b(virtual={VIRTUAL})\n")
        full = work / f"gen_{divisor}_full.pps"  # written out: past what a small file may ask for
        subprocess.run([*ppdsl, "expand", "--max-steps", "20000000", str(gen), "-o", str(full)], check=True)
        subprocess.run([*ppdsl, "convert", str(full), str(csv_path)], check=True)
        origin = "ppdsl's interleaved_1f1b (torch not installed)"
    gen = work / f"onefoneb_{divisor}.pps"
    gen.write_text(f"pipeline ranks={RANKS} microbatches={EXPLICIT_MICROBATCHES // divisor}\nuse 1f1b()\n")
    explicit = work / f"explicit_{divisor}.pps"
    subprocess.run([*ppdsl, "expand", "--max-steps", "20000000", str(gen), "-o", str(explicit)], check=True)
    return csv_path, explicit, origin


def count_actions(path: Path) -> int:
    text = path.read_text()
    if path.suffix == ".csv":
        return sum(1 for line in text.splitlines() for cell in line.split(",") if cell.strip())
    return sum(len(line.split()) - 2 for line in text.splitlines() if line.startswith("rank "))


def compile_sources() -> None:
    """Write the bytecode of the ppdsl the children import, once, untimed. A source checkout
    run with PYTHONDONTWRITEBYTECODE=1 (as on the shared machine) has none, and every child
    then compiles every ppdsl module it imports: `ppdsl lint tiny.pps` took 0.51-0.68 s of CPU
    so against 0.26-0.35 s with the bytecode written (five runs each), start-up that a user
    of the installed wheel (compiled by pip) never pays and that made the subtracted
    start-up the noisiest number here."""
    import compileall
    import importlib.util

    spec = importlib.util.find_spec("ppdsl")
    if spec is not None and spec.origin is not None:
        compileall.compile_dir(str(Path(spec.origin).parent), quiet=1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="rounds (default 3); medians are printed")
    ap.add_argument("--no-torch", action="store_true", help="skip PyTorch's chain (~30-50 s a round)")
    ap.add_argument("--quick", action="store_true", help="quarter size only, one round, no PyTorch")
    args = ap.parse_args()
    try:
        import importlib.util

        have_torch = importlib.util.find_spec("torch") is not None
    except Exception:  # noqa: BLE001
        have_torch = False
    torch_chain = have_torch and not args.no_torch and not args.quick
    repeat = 1 if args.quick else args.repeat
    divisors = (4,) if args.quick else (4, 1)
    ppdsl = ppdsl_command()

    with tempfile.TemporaryDirectory(prefix="ppdsl-bench-cli-") as tmp:
        work = Path(tmp)
        inputs = {d: make_inputs(work, d, have_torch) for d in divisors}
        tiny_csv = work / "tiny.csv"
        tiny_csv.write_text("0F0,0B0\n")
        tiny_pps = work / "tiny.pps"
        tiny_pps.write_text("pipeline ranks=1 microbatches=1\nrank 0: 0F0 0B0\n")

        def commands(d: int) -> dict[str, tuple[list[str], list[str]]]:
            """name -> (the command, the same command on a two-action file: its start-up)."""
            csv_path, explicit, _ = inputs[d]
            lowered = work / f"lowered_{d}.pps"
            return {
                "lint CSV": ([*ppdsl, "lint", str(csv_path)], [*ppdsl, "lint", str(tiny_csv)]),
                "expand --comms CSV": ([*ppdsl, "expand", "--comms", str(csv_path), "-o", str(lowered)],
                                       [*ppdsl, "expand", "--comms", str(tiny_csv), "-o", str(work / "t.pps")]),
                # Past the default 500,000 steps (limits.DEFAULT_MAX_STEPS): --max-steps, as a user would.
                "lint lowered": ([*ppdsl, "lint", *BIG, str(lowered)], [*ppdsl, "lint", *BIG, str(tiny_pps)]),
                "expand explicit": ([*ppdsl, "expand", *BIG, str(explicit), "-o", str(work / "e.pps")],
                                    [*ppdsl, "expand", *BIG, str(tiny_pps), "-o", str(work / "t2.pps")]),
            }

        # Actions each command handles: the CSV's, the lowered file's (what expand writes and the
        # second lint reads), the explicit file's.
        Run(commands(divisors[-1])["expand --comms CSV"][0])  # the lowered files exist before counting
        if len(divisors) > 1:
            Run(commands(divisors[0])["expand --comms CSV"][0])
        sizes = {}
        for d in divisors:
            csv_path, explicit, _ = inputs[d]
            n_csv, n_low = count_actions(csv_path), count_actions(work / f"lowered_{d}.pps")
            sizes[d] = {"lint CSV": n_csv, "expand --comms CSV": n_low, "lint lowered": n_low,
                        "expand explicit": count_actions(explicit)}

        # samples[d][name] = list of (wall, cpu, wall of start-up, cpu of start-up, rss)
        samples: dict[int, dict[str, list[tuple[float, float, float, float, float]]]] = {d: {} for d in divisors}
        torch_times: list[float] = []
        torch_cpu: list[float] = []
        full = divisors[-1]
        order_csv = work / "order.csv"
        order_net: list[float] = []
        order_torch: list[float] = []
        if torch_chain:
            subprocess.run([sys.executable, "-c", TORCH_ORDER_CSV, str(RANKS), str(MICROBATCHES), str(VIRTUAL),
                            str(order_csv)], check=True)
            same = order_csv.read_bytes() == inputs[full][0].read_bytes()
            print(f"order.csv (pipeline_order) is {'byte-identical to' if same else 'not the same as'} "
                  f"{inputs[full][0].name} (_calculate_single_rank_operations)", flush=True)

        def chain_on(csv_path: Path) -> list[tuple[list[str], list[str]]]:
            """The chain's three commands on `csv_path`, each with its start-up command."""
            cmds = commands(full)
            lowered = work / f"{csv_path.stem}_lowered.pps"
            return [([*ppdsl, "lint", str(csv_path)], cmds["lint CSV"][1]),
                    ([*ppdsl, "expand", "--comms", str(csv_path), "-o", str(lowered)], cmds["expand --comms CSV"][1]),
                    ([*ppdsl, "lint", *BIG, str(lowered)], cmds["lint lowered"][1])]

        print(f"rounds: {repeat}; ppdsl: {ppdsl[0]}; schedule from {inputs[full][2]}", flush=True)
        for round_no in range(repeat):
            for d in divisors:
                for name, (cmd, empty) in commands(d).items():
                    run, start = Run(cmd), Run(empty)
                    samples[d].setdefault(name, []).append((run.wall, run.cpu, start.wall, start.cpu, run.rss_mb))
            if torch_chain:
                wall, cpu = run_torch_chain(inputs[full][0])
                torch_times.append(wall)
                torch_cpu.append(cpu)
                # The schedule object's own order: ppdsl's chain, then PyTorch's, on it.
                order_net.append(sum(Run(cmd).wall - Run(empty).wall for cmd, empty in chain_on(order_csv)))
                order_torch.append(run_torch_chain(order_csv)[0])
            # This round's chain (start-up subtracted) beside PyTorch's, as the medians below are made.
            net = sum(samples[full][k][-1][0] - samples[full][k][-1][2] for k in ("lint CSV", "expand --comms CSV", "lint lowered"))
            line = f"  round {round_no + 1}: ppdsl chain {net:.2f} s"
            if torch_chain:
                line += (f", PyTorch {torch_times[-1]:.2f} s ({torch_times[-1] / net:.1f}x); on pipeline_order "
                         f"{order_net[-1]:.2f} s against {order_torch[-1]:.2f} s ({order_torch[-1] / order_net[-1]:.1f}x)")
            print(line, flush=True)

    def med(values: list[float]) -> float:
        return statistics.median(values)

    def net(d: int, name: str) -> tuple[float, float, float, float]:
        """Median wall and cpu with start-up subtracted, median start-up wall, max rss."""
        s = samples[d][name]
        return (med([w - sw for w, _, sw, _, _ in s]), med([c - sc for _, c, _, sc, _ in s]),
                med([sw for _, _, sw, _, _ in s]), max(r for *_, r in s))

    print()
    print(f"{'command (start-up subtracted)':<24}{'size':>6}{'actions':>10}{'wall s':>8}{'cpu s':>8}"
          f"{'actions/s wall':>16}{'actions/s cpu':>15}{'start-up s':>12}{'peak MB':>9}")
    for name in commands(full):
        for d in divisors:
            n = sizes[d][name]
            wall, cpu, start, rss = net(d, name)
            label = "1/4" if d == 4 else "1"
            print(f"{name:<24}{label:>6}{n:>10,}{wall:>8.3f}{cpu:>8.3f}{n / wall:>16,.0f}{n / cpu:>15,.0f}"
                  f"{start:>12.3f}{rss:>9.0f}")
    if len(divisors) > 1:
        print("\ntime per action (cpu, start-up subtracted), 1/4 size -> full size:")
        for name in commands(full):
            small, big = net(4, name)[1] / sizes[4][name], net(1, name)[1] / sizes[1][name]
            print(f"  {name:<22} {1e6 * small:.3f} -> {1e6 * big:.3f} us/action  (x{big / small:.2f})")

    chain = ("lint CSV", "expand --comms CSV", "lint lowered")
    rounds = len(samples[full]["lint CSV"])
    chain_net = [sum(samples[full][k][i][0] - samples[full][k][i][2] for k in chain) for i in range(rounds)]
    chain_raw = [sum(samples[full][k][i][0] for k in chain) for i in range(rounds)]
    chain_cpu = [sum(samples[full][k][i][1] - samples[full][k][i][3] for k in chain) for i in range(rounds)]
    n_csv = sizes[full]["lint CSV"]
    wall_csv = net(full, "lint CSV")[0]
    n_exp = sizes[full]["expand explicit"]
    wall_exp = net(full, "expand explicit")[0]
    peak = net(full, "lint lowered")[3]
    print()
    cpu_csv, cpu_exp = net(full, "lint CSV")[1], net(full, "expand explicit")[1]
    print(f"lint CSV:        {n_csv / wall_csv:>12,.0f} actions/s wall, {n_csv / cpu_csv:>12,.0f} cpu "
          f"(goal 500,000: {'met' if n_csv / wall_csv >= 500_000 else 'NOT met'} on the wall clock)")
    print(f"expand explicit: {n_exp / wall_exp:>12,.0f} actions/s wall, {n_exp / cpu_exp:>12,.0f} cpu "
          f"(goal 1,000,000: {'met' if n_exp / wall_exp >= 1_000_000 else 'NOT met'} on the wall clock)")
    n_low, wall_low = sizes[full]["lint lowered"], net(full, "lint lowered")[0]
    print(f"lint lowered:    {n_low / wall_low:>12,.0f} actions/s wall "
          f"(goal 1,000,000: {'met' if n_low / wall_low >= 1_000_000 else 'NOT met'} on the wall clock)")
    print(f"lint lowered peak resident: {peak:.0f} MB (goal < 400: {'met' if peak < 400 else 'NOT met'})")
    print(f"ppdsl chain: {med(chain_net):.2f} s start-up subtracted (spread {min(chain_net):.2f}-{max(chain_net):.2f}), "
          f"{med(chain_raw):.2f} s as run; cpu {med(chain_cpu):.2f} s start-up subtracted")
    if torch_times:
        t = med(torch_times)
        print(f"PyTorch chain: {t:.2f} s (spread {min(torch_times):.2f}-{max(torch_times):.2f}); cpu {med(torch_cpu):.2f} s")
        ratio = t / med(chain_net)
        print(f"ratio: ppdsl's chain is {ratio:.1f}x faster start-up subtracted, {t / med(chain_raw):.1f}x as run, "
              f"{med(torch_cpu) / med(chain_cpu):.1f}x in cpu time (goal 12x: {'met' if ratio >= 12 else 'NOT met'})")
    if order_torch:
        t, c = med(order_torch), med(order_net)
        print(f"on the schedule object's own order (pipeline_order): PyTorch's chain {t:.2f} s (spread "
              f"{min(order_torch):.2f}-{max(order_torch):.2f}), ppdsl's {c:.2f} s start-up subtracted (spread "
              f"{min(order_net):.2f}-{max(order_net):.2f}): {t / c:.1f}x (goal 10x: {'met' if t / c >= 10 else 'NOT met'})")
    elif not have_torch:
        print("torch is not installed: no PyTorch chain (pip install torch==2.13.0 to compare)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
