"""Print the fully explicit program: generators, ranges and zips expanded.

Reads .pps and PyTorch .csv. The output is itself a valid .pps file.

With --comms, a compute-only program gets its sends and receives, in an order that cannot
deadlock even when every send blocks (gloo); --fuse then batches adjacent ones as
`<0SEND_F3 0RECV_B0>` where --comm-model (default rendezvous) stays deadlock-free.

With --fsdp, every stage is sharded: each rank's row gets UNSHARD before a stage is used (with
a prefetch window, --fsdp-window), RESHARD once it leaves the window, and REDUCE_GRAD after
the stage's last backward, as PyTorch's lowering places them for FSDP.
"""

from __future__ import annotations

import argparse

from ..diagnostics import UsageError
from ..limits import DEFAULT_MAX_LOWERED_STEPS
from ..load import load_program
from ..shard_actions import DEFAULT_WINDOW, add_reduce_actions, add_shard_actions
from ..syntax.printer import print_program
from .common import add_max_steps, refuse_csv_output, refuse_overwriting, write_output


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="a .pps or .csv schedule")
    p.add_argument("-o", "--output", metavar="OUT", help="write here instead of stdout")
    p.add_argument("--dialect", choices=("current", "legacy"), help="CSV dialect (default: detected)")
    p.add_argument("--comms", action="store_true", help="insert sends and receives (compute-only input)")
    p.add_argument("--fuse", action="store_true", help="with --comms: batch adjacent sends and receives of a rank")
    p.add_argument("--comm-model", choices=("rendezvous", "grouped", "buffered"),
                   help="with --fuse: the model the batches must stay deadlock-free under (default rendezvous)")
    p.add_argument("--fsdp", action="store_true",
                   help="shard every stage: place UNSHARD, RESHARD and REDUCE_GRAD in each rank's row")
    p.add_argument("--fsdp-window", type=int, metavar="N",
                   help=f"with --fsdp: how many stages a rank keeps gathered at once, the one computing included "
                        f"(default {DEFAULT_WINDOW}, PyTorch's max_active_stages)")
    p.add_argument("--reduce-grad", action="store_true",
                   help="place each stage's REDUCE_GRAD after its last backward (where replicas average its "
                        "gradients and tied parameters are summed); --fsdp places them too")
    add_max_steps(p, lowered="with --comms")


def run(args: argparse.Namespace) -> int:
    refuse_overwriting(args.file, args.output)
    refuse_csv_output(args.output, "expand")
    default = DEFAULT_MAX_LOWERED_STEPS if args.comms else None
    program = load_program(args.file, dialect=args.dialect, steps_limit=args.max_steps or default)
    if args.fuse and not args.comms:
        raise UsageError("--fuse needs --comms")
    if args.comm_model is not None and not args.fuse:
        raise UsageError("--comm-model says what --fuse's batches must stay deadlock-free under: give it with "
                         "--comms --fuse")
    args.comm_model = args.comm_model or "rendezvous"
    if args.fsdp_window is not None and not args.fsdp:
        raise UsageError("--fsdp-window needs --fsdp")
    if args.fsdp and args.reduce_grad:
        raise UsageError("--fsdp places REDUCE_GRAD too: give one of --fsdp and --reduce-grad")
    if args.fsdp:
        program = add_shard_actions(program, DEFAULT_WINDOW if args.fsdp_window is None else args.fsdp_window)
    if args.reduce_grad:
        program = add_reduce_actions(program)
    if args.comms:
        from ..check import lower_checked

        lowered = lower_checked(program, fuse=args.fuse, comm_model=args.comm_model)
        sharded = " and sharding actions" if args.fsdp else " and REDUCE_GRAD" if args.reduce_grad else ""
        write_output(args.output, print_program(lowered, f"{args.file} with sends and receives{sharded} "
                                                f"(deadlock-free under {args.comm_model})"))
        return 0
    note = f"{args.file} with sharding actions" if args.fsdp else \
        f"{args.file} with REDUCE_GRAD" if args.reduce_grad else None
    if program.generated is not None:
        call = ", ".join(f"{k}={v}" for k, v in program.generated.arguments)
        note = f"expanded from `use {program.generated.name}({call})` in {args.file}"
    write_output(args.output, print_program(program, note))
    return 0
