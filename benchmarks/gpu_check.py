"""The GPU check: one command for a machine with one GPU and PyTorch, under 8 minutes.

    python benchmarks/gpu_check.py [--device cuda|cpu] [--quick]

Prints, as tables:
1. the compatibility matrix's torch cells (`compat_matrix.py`: 1f1b, zb1p, zbv,
   interleaved_1f1b, dualpipev x a user's own classes, checkpointing, autocast, bf16
   parameters, a tie, Embedding + Conv1d, a user's autograd Function), each one step of a
   one-rank program with several stages against the unpipelined model on that device;
2. the split backward's (I + W) / B on the GPT example under each setting
   (`bench_split_gpt.py`), with the allocator's peak beside the bytes the checker predicts.

Programs are of one rank (NCCL refuses two ranks on one GPU), so nothing here needs a process
group. `--device` defaults to `cuda` where a GPU is visible, else `cpu` (the tests run it so);
`--quick` takes fewer rounds. It needs ppdsl importable (this checkout on `PYTHONPATH`, with
`lark` and `attrs` installed). Exit status 0 when every cell is exact, 1 otherwise; the speed
figures are printed with their goals and decide nothing (a timing is a measurement, not a test).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))


def main(argv: list[str] | None = None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="5 rounds of the split figure instead of 21")
    args = p.parse_args(argv)
    import bench_split_gpt
    import compat_matrix

    started = time.perf_counter()
    name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "CPU"
    print(f"gpu_check: torch {torch.__version__}, device {args.device} ({name})", flush=True)
    print("\n| schedule | setting | worst gradient difference | loss difference | verdict |")
    print("| --- | --- | --- | --- | --- |")
    bad = 0
    for schedule, setting in compat_matrix.cells("torch"):
        try:
            r = compat_matrix.run_cell("torch", schedule, setting, args.device)
        except Exception as exc:  # noqa: BLE001 - a cell that fails is a row of the table
            bad += 1
            print(f"| {schedule} | {setting} | - | - | FAILED: {type(exc).__name__}: {str(exc)[:160]} |", flush=True)
            continue
        bad += not r["ok"]
        verdict = "exact" if r["ok"] else "WRONG: " + "; ".join(r["missing"] + r["left"]) or "over tolerance"
        print(f"| {schedule} | {setting} | {r['worst']:.1e} | {r['loss']:.1e} | {verdict} |", flush=True)
    print(f"\n{bad} of {len(compat_matrix.cells('torch'))} cells not exact\n" if bad else
          f"\nall {len(compat_matrix.cells('torch'))} cells exact\n")
    print("The split backward on the GPT example (one rank, zb1p against 1f1b):")
    rounds = 5 if args.quick else 21
    bench_split_gpt.main(["--device", args.device, "--rounds", str(rounds)],
                         emit=lambda line: print(f"    {line}", flush=True))
    print(f"\ngpu_check: {time.perf_counter() - started:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
