"""Train with a schedule file across ranks, with PaddlePaddle or PyTorch.

With no other argument, starts one local CPU process per rank (gloo over loopback), builds a
small built-in MLP cut into the schedule's stages, trains a few steps on synthetic data and
prints each step's loss. Your own model: --model/--data/--loss (see docs/runtime.md).
Under `python -m paddle.distributed.launch` (or `torchrun`) it uses
the launcher's processes instead.

The file is linted first under the communication model of the transport the run has (on
gloo `buffered`, sends going out in the background, or `rendezvous` with --blocking-sends;
`grouped` for NCCL) and refused, with the wait-for cycle, when it would hang there.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..diagnostics import UsageError
from ..wording import plural
from ..limits import DEFAULT_MAX_LOWERED_STEPS, MAX_COST, MAX_SECONDS, MAX_STEPS
from ..runtime.framework import FRAMEWORKS, PADDLE
from .common import add_max_steps, number, refuse_overwriting, require_directory_of, whole_number

if TYPE_CHECKING:  # pragma: no cover
    from ..ir import Program
    from ..runtime.jobs.devices import Device
    from ..runtime.jobs.launcher import FileOutcome
    from ..semantics import CommModel

MAX_THREADS = 1024
MAX_REPLICAS = 1024


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", nargs="+",
                   help="a .pps or .csv schedule; several run one after another in the same processes")
    p.add_argument("--steps", type=whole_number(1, MAX_STEPS), default=20, help="training steps (default 20)")
    p.add_argument("--framework", choices=FRAMEWORKS, default=None,
                   help="run the stages with PaddlePaddle or PyTorch (default: the one a --model module "
                        "imports; under torchrun PyTorch; else Paddle where it is installed, else PyTorch)")
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                   help="where each rank's stages, messages and optimizer state live: auto (default: a GPU per "
                        "local rank when the framework has CUDA and there are enough, else the CPU), cpu, or gpu")
    p.add_argument("--model", metavar="MODULE[:NAME]",
                   help="build_stage(stage_index, num_stages) -> paddle.nn.Layer (torch.nn.Module with "
                        "--framework torch); a MODULE alone also gives "
                        "its `batches` and `loss` as --data and --loss")
    p.add_argument("--data", metavar="MODULE:NAME", help="batches() -> iterable of (inputs, targets)")
    p.add_argument("--loss", metavar="MODULE:NAME", help="loss(output, target) -> scalar tensor")
    p.add_argument("--optimizer", default="sgd", metavar="NAME",
                   help="sgd, momentum, adam, adamw, or MODULE:NAME taking the parameters (default sgd)")
    p.add_argument("--lr", type=number(-MAX_COST, MAX_COST), default=0.05, help="learning rate (default 0.05)")
    p.add_argument("--seed", type=whole_number(0, 2**32 - 1),  # numpy seeds are 32-bit
                   default=0, help="seed of the initial weights and built-in data")
    p.add_argument("--timeout", type=number(0, MAX_SECONDS), default=60.0, metavar="SECONDS",
                   help="longest any rank waits for another (default 60; gloo itself stops at 30)")
    p.add_argument("--verify", action="store_true",
                   help="also run the unpipelined model and compare losses and gradients")
    p.add_argument("--rtol", type=number(0, 1, low_inclusive=True), default=1e-6, help="relative tolerance of --verify (default 1e-6)")
    p.add_argument("--profile", metavar="OUT.json", help="write measured per-action times (ppdsl simulate --costs)")
    p.add_argument("--clip-grad-norm", type=number(0, MAX_COST), metavar="X",
                   help="before each optimizer step, scale every gradient so that the whole model's gradient norm "
                        "(over all ranks) is at most X; --verify clips the unpipelined model the same way")
    p.add_argument("--skip-nonfinite", action="store_true",
                   help="a non-finite loss or gradient on any rank skips that step's optimizer step on every rank "
                        "(said on the step's progress line)")
    p.add_argument("--sum-grads", action="store_true",
                   help="sum microbatch gradients instead of averaging them (Paddle's own behaviour)")
    p.add_argument("--no-split-backward", action="store_true",
                   help="run I as paddle.grad with the graph kept and W as a second backward, instead of "
                        "deferring the Linear layers' weight gradients to W")
    p.add_argument("--no-grad-guard", action="store_true",
                   help="do not check that every parameter a stage's forward used ends the step with a gradient")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="each rank says which path each of its stages' weight gradients takes (split or whole), "
                        "and a rank that fails prints its whole traceback")
    p.add_argument("--blocking-sends", action="store_true",
                   help="on gloo, make each send wait for its receive (the rendezvous model) instead of "
                        "sending in the background beside compute (the buffered model)")
    p.add_argument("--data-parallel", "--dp", type=whole_number(1, MAX_REPLICAS), default=1, metavar="N",
                   help="N replicas of the pipeline (ranks x N processes), each on its share of every batch, "
                        "their gradients averaged each step (default 1)")
    p.add_argument("--fsdp", type=whole_number(1, MAX_REPLICAS), default=1, metavar="N",
                   help="shard every stage's weights over N processes with PyTorch's FSDP2 (ranks x N processes, "
                        "each on its share of every batch; with --data-parallel D, D x N per rank as torch's HSDP); "
                        "UNSHARD, RESHARD and REDUCE_GRAD are placed as `ppdsl expand --fsdp` does where the file "
                        "places none (default 1: not sharded)")
    p.add_argument("--tp", type=whole_number(1, MAX_REPLICAS), default=1, metavar="N",
                   help="split every stage over N tensor-parallel processes with PyTorch's tensor parallelism "
                        "(ranks x N processes, all on the same rows); the built-in model has its own plan, a --model "
                        "module gives `parallelize(stage, mesh)` (default 1)")
    p.add_argument("--threads", type=int, metavar="N",
                   help="intra-op threads per local rank (default: cores / ranks, at least 1)")
    add_max_steps(p, DEFAULT_MAX_LOWERED_STEPS)
    p.add_argument("--logs", metavar="DIR", help="keep each rank's log in DIR")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the summary")


def _chosen_framework(model: str | None, env: Mapping[str, str]) -> str:
    """The framework a run without `--framework` uses: the launcher's (Paddle's launcher sets
    PADDLE_TRAINER_ID, torchrun TORCHELASTIC_RUN_ID), else the one a `--model` module imports,
    else the one installed (Paddle when both are)."""
    from ..runtime.framework import TORCH, default_framework
    from ..runtime.jobs.models import framework_of_model

    if "PADDLE_TRAINER_ID" in env:
        return PADDLE
    if "TORCHELASTIC_RUN_ID" in env:
        return TORCH
    return (framework_of_model(model) if model else None) or default_framework()


def _check_args(args: argparse.Namespace) -> None:
    if args.threads is not None and not 1 <= args.threads <= MAX_THREADS:
        raise UsageError(f"--threads must be between 1 and {MAX_THREADS}")
    if (args.data_parallel > 1 or args.tp > 1) and args.profile:
        raise UsageError("--profile measures one pipeline: run it without --data-parallel and --tp")
    if args.fsdp > 1 and args.tp > 1:
        raise UsageError("--fsdp and --tp together are not supported yet: shard the stages or split them, not both")
    if args.fsdp > 1 or args.tp > 1:
        from ..runtime.framework import PADDLE_SHARDING_REFUSED, PADDLE_TENSOR_PARALLEL_REFUSED, TORCH

        if args.framework != TORCH:
            raise UsageError(PADDLE_SHARDING_REFUSED if args.fsdp > 1 else PADDLE_TENSOR_PARALLEL_REFUSED)
    _check_outputs(args)


def _check_outputs(args: argparse.Namespace) -> None:
    """What a run writes is checked before any process starts: a run of minutes that ends in a
    path it cannot write, or one that writes its profile over the schedule, loses the run."""
    import os

    if args.profile:
        if os.path.isdir(args.profile):
            raise UsageError(f"--profile {args.profile} is a directory: name the file to write, e.g. "
                             f"{os.path.join(args.profile, 'profile.json')}")
        for file in args.file:
            refuse_overwriting(file, args.profile)
        require_directory_of(args.profile, f"--profile {args.profile}")
    if args.logs and os.path.exists(args.logs) and not os.path.isdir(args.logs):
        raise UsageError(f"--logs {args.logs} is a file: name a directory to keep the ranks' logs in")


def _programs(files: list[str], model: CommModel, steps_limit: int | None = None, shards: int = 1) -> list[Program]:
    """Each file loaded (with sharding actions placed for `shards` > 1), linted under `model`,
    lowered and compiled for every rank."""
    from ..load import load_program
    from ..runtime.interpreter.plan import compile_rank
    from ..runtime.interpreter.preflight import prepare
    from ..runtime.jobs.worker import sharded_program

    programs: list[Program] = []
    for file in files:
        program = sharded_program(load_program(file, steps_limit=steps_limit), shards)
        program = prepare(program, model)
        for rank in range(program.ranks):
            compile_rank(program, rank)
        if programs and program.ranks != programs[0].ranks:
            raise UsageError(f"{file} has {plural(program.ranks, 'rank')} but {files[0]} has {programs[0].ranks}: "
                             "files run together must have the same number of ranks")
        programs.append(program)
    return programs


def run(args: argparse.Namespace) -> int:
    import os
    import warnings

    from ..runtime.transport.comm import comm_model_of
    from ..runtime.jobs.worker import in_distributed_env
    from ..semantics import CommModel

    from ..runtime.framework import require

    if args.framework is None:
        args.framework = _chosen_framework(args.model, os.environ)
    _check_args(args)
    # Importing a framework (the user's model does) sets OMP_NUM_THREADS in this process: the
    # user's own value, or its absence, is what chooses the ranks' threads.
    users_threads = os.environ.get("OMP_NUM_THREADS")
    # Paddle warns on import that it has no compiler cache for C++ extensions, which ppdsl builds none of.
    warnings.filterwarnings("ignore", message="No ccache found", category=UserWarning)
    distributed = in_distributed_env(args.framework)  # a rank started by us, Paddle's launcher or torchrun
    programs: list[Program] = []
    if not distributed or "PPDSL_REPORT_FD" not in os.environ:
        # Everything checkable alone is checked before any process (or, under Paddle's
        # launcher, any process group) starts: exit 1 for a bad file, 2 for a bad argument.
        if distributed:
            from ..load import load_program
            from ..runtime.jobs.process_layout import check_world
            from ..runtime.jobs.worker import backend_from_env, rank_from_env

            # The launcher's world must hold every replica: said before the framework loads (seconds
            # on a busy host), so that each rank says it before the launcher ends the job over the first.
            check_world(load_program(args.file[0], steps_limit=args.max_steps or DEFAULT_MAX_LOWERED_STEPS).ranks,
                        args.data_parallel * args.fsdp, rank_from_env(args.framework)[1], args.fsdp, args.tp)
            require(args.framework)
            model = comm_model_of(backend_from_env(args.framework, args.device),  # exit 2 without the device
                                  not args.blocking_sends)
        else:
            device = _local_device(args.device, args.framework, args.file[0], args.max_steps or DEFAULT_MAX_LOWERED_STEPS)
            # On the CPU gloo: buffered with sends in the background, else rendezvous; NCCL's grouped on GPUs.
            model = comm_model_of(device.backend, not args.blocking_sends)
        programs = _programs(args.file, model, args.max_steps or DEFAULT_MAX_LOWERED_STEPS, args.fsdp)
        if not distributed:
            _warn_oversubscription(programs[0].ranks * args.data_parallel * args.fsdp * args.tp, args.threads)
        from ..runtime.jobs.models import check_contract, check_forms

        check_forms(args.model, args.data, args.loss, args.optimizer)
        require(args.framework)  # exit 2 with the install command
        args.model, args.data, args.loss = check_contract(args.model, args.data, args.loss, args.optimizer,
                                                          [p.stages for p in programs], args.framework)
        _check_batches(args.data, args.framework, programs, args.file, args.data_parallel * args.fsdp)
        if args.tp > 1 and args.model is not None:
            from ..runtime.jobs.models import SetupFailure, tensor_plan

            try:
                tensor_plan(args.model)
            except SetupFailure as exc:
                raise UsageError(str(exc)) from None
        if users_threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = users_threads
    if distributed:
        from ..runtime.jobs.worker import run_from_args

        return run_from_args(args)
    return _launch(args, programs, device)


def _local_device(requested: str, framework: str, file: str, steps_limit: int) -> Device:
    """The device kind of every local rank (one per rank of `file`), decided once before they
    start (gloo and NCCL do not mix): exit 2 when `--device gpu` cannot be had. The framework
    is imported only where a GPU driver's device node exists (`devices.hints_of_gpus`) or a GPU
    is asked for."""
    from ..load import load_program
    from ..runtime.jobs.devices import AUTO, CPU, CPU_DEVICE, choose_device, hints_of_gpus
    from ..runtime.framework import get_framework

    if requested == CPU:
        return choose_device(CPU, False, 0, 0, 1, {})
    if requested == AUTO and not hints_of_gpus():
        return CPU_DEVICE
    ranks = load_program(file, steps_limit=steps_limit).ranks
    fw = get_framework(framework)
    return choose_device(requested, fw.cuda_built(), fw.device_count(), 0, ranks, {})


def _check_batches(data: str | None, framework: str, programs: list[Program], files: list[str],
                   replicas: int = 1) -> None:
    """A batch that does not split into a file's microbatches (of every replica) is exit 2
    now, not a failure of every rank after they start."""
    if data is None:
        return
    from ..runtime.jobs.process_layout import batch_splits
    from ..runtime.jobs.models import batch_rows

    rows = batch_rows(data, framework)
    if rows is None:
        return
    for file, program in zip(files, programs):
        if replicas > 1 and rows % (replicas * program.microbatches):
            raise UsageError(f"--data {data}: a batch of {rows} cannot be split into {replicas} replicas x "
                             f"{program.microbatches} microbatches of {file}; a batch of {rows} splits for "
                             f"--data-parallel {', '.join(map(str, batch_splits(rows, program.microbatches))) or 'none'} "
                             f"with {plural(program.microbatches, 'microbatch')}, or let batches() yield a multiple "
                             f"of {replicas * program.microbatches} rows")
        if rows % program.microbatches:
            fits = [m for m in range(1, rows + 1) if rows % m == 0]
            raise UsageError(f"--data {data}: a batch of {rows} cannot be split into the {program.microbatches} "
                             f"microbatches of {file}; a batch of {rows} splits into "
                             f"{', '.join(map(str, fits))} microbatches, or let batches() yield a multiple of "
                             f"{program.microbatches} rows")


def _warn_oversubscription(ranks: int, requested: int | None) -> None:
    """Before any process starts: more threads than cores slow every step (`oversubscription`)."""
    from ..runtime.jobs.launcher import oversubscription, threads_per_rank

    warning = oversubscription(ranks, threads_per_rank(ranks, requested)[0])
    if warning is not None:
        print(f"ppdsl run: warning: {warning}", file=sys.stderr, flush=True)


def _launch(args: argparse.Namespace, programs: list[Program], device: Device) -> int:
    from ..runtime.jobs.launcher import launch, threads_per_rank

    out = sys.stdout
    first = programs[0]
    replicas = args.data_parallel * args.fsdp * args.tp  # processes per pipeline rank
    threads, why = threads_per_rank(first.ranks * replicas, args.threads)
    if not args.quiet:
        what = args.file[0] if len(args.file) == 1 else f"{len(args.file)} files"
        where = "one GPU each, " if device.is_gpu else ""
        copies = f" x {plural(args.data_parallel, 'replica')}" if args.data_parallel > 1 else ""
        copies += f" x {args.fsdp} shards" if args.fsdp > 1 else ""
        copies += f" x {args.tp} tensor-parallel ranks" if args.tp > 1 else ""
        copies += f" ({first.ranks * replicas} processes)" if replicas > 1 else ""
        print(f"ppdsl run: {what}: {plural(first.ranks, 'rank')}{copies}, {plural(first.stages, 'stage')}, "
              f"{plural(first.microbatches, 'microbatch')}, {plural(args.steps, 'step')} on {args.framework} "
              f"({device.backend}, local processes, {where}{plural(threads, 'thread')} each: {why})", file=out, flush=True)
    args.device = device.kind  # every rank binds the kind decided here
    outcome = launch(programs, _rebuild_argv(args), steps=args.steps, timeout=args.timeout, quiet=args.quiet,
                     keep_logs=args.logs, names=args.file, threads=threads, device=device, replicas=replicas,
                     tensor=args.tp)
    if outcome.failure is not None:
        root = outcome.root
        if root is None:
            print(f"ppdsl run: failed: {outcome.failure}", file=sys.stderr)
            return 1
        # As each rank says it under another launcher: the failed rank's block, then the others' line.
        print(root.block(outcome.traceback, args.verbose), file=sys.stderr)
        others = [r for r in range(first.ranks * replicas) if r != root.rank]
        if others:
            print(root.stopped_line(others), file=sys.stderr)
        return 1
    for index, file in enumerate(args.file):
        f = outcome.file(index)
        losses = [f.losses[s] for s in sorted(f.losses)]
        summary = f"ppdsl run: {file}: {plural(len(f.step_times) or len(losses), 'step')}"
        if losses:
            summary += f", loss {losses[0]:.6f} -> {losses[-1]:.6f}"
        if f.step_time:
            summary += f", {f.step_time * 1e3:.2f} ms/step"
        if f.verify is not None:
            summary += ", verify ok" if f.verify.get("ok") else ", verify FAILED"
        print(summary, file=out)
    if args.profile and outcome.profile is not None:
        print(f"ppdsl run: wrote {args.profile} ({outcome.profile.get('actions')} measured actions)"
              + _simulated_vs_measured(args.profile, args.file[-1], outcome.file(len(programs) - 1),
                                       "rendezvous" if args.blocking_sends else "buffered", args.fsdp), file=out)
        for index, file in enumerate(args.file):
            for m in outcome.file(index).memory:
                print(memory_line(m, file if len(args.file) > 1 else ""), file=out)
    return outcome.code


def _rebuild_argv(args: argparse.Namespace) -> list[str]:
    """The arguments again, for each rank's own `ppdsl run`."""
    argv = [*args.file, "--steps", str(args.steps), "--framework", args.framework, "--device", args.device,
            "--optimizer", args.optimizer, "--lr", repr(args.lr),
            "--seed", str(args.seed), "--timeout", repr(args.timeout), "--rtol", repr(args.rtol),
            "--data-parallel", str(args.data_parallel), "--fsdp", str(args.fsdp), "--tp", str(args.tp)]
    for name in ("model", "data", "loss", "profile"):
        value = getattr(args, name)
        if value is not None:
            argv += [f"--{name}", value]
    if args.clip_grad_norm is not None:
        argv += ["--clip-grad-norm", repr(args.clip_grad_norm)]
    for flag, name in (("--verify", "verify"), ("--sum-grads", "sum_grads"), ("--no-split-backward", "no_split_backward"),
                       ("--blocking-sends", "blocking_sends"), ("--no-grad-guard", "no_grad_guard"), ("--verbose", "verbose"),
                       ("--skip-nonfinite", "skip_nonfinite")):
        if getattr(args, name):
            argv.append(flag)
    return argv


def memory_line(m: dict[str, object], file: str = "") -> str:
    """One rank's measured memory next to the checker's prediction."""
    where = f"{file}: " if file else ""
    line = (f"ppdsl run: {where}rank {m['rank']}: peak {m['peak_microbatches']} live graphs, one per stage and microbatch "
            f"(checker predicts {m['predicted_microbatches']}), {_mib(m['peak_bytes'])} in tensors kept between actions")
    if "allocator_peak_bytes" in m:
        line += f", allocator peak {_mib(m['allocator_peak_bytes'])} on {m.get('device', 'the GPU')}"
    return line


def _mib(n: object) -> str:
    return f"{float(n) / 2**20:.2f} MiB" if isinstance(n, (int, float)) else "?"


def _simulated_vs_measured(path: str, file: str, outcome: FileOutcome, model: str, shards: int = 1) -> str:
    """How far `ppdsl simulate FILE --costs PATH` (the same function) is from the measured step;
    with `shards` (`--fsdp`), of the program with the sharding actions the run placed.

    The step compared leaves out the time the profile spent counting memory (on the rank that
    spent most: any rank's count delays the others), as the actions' times in the profile do:
    what is predicted is a step without `--profile`."""
    from ..costs import CostError
    from ..diagnostics import PpsError
    from ..runtime.jobs.worker import sharded_program
    from .simulate_cmd import num, simulate_file

    if not outcome.step_time:
        return ""
    measured = outcome.step_time - outcome.counting_time
    placed: list[bool] = []

    def shape(program: Program) -> Program:
        sharded = sharded_program(program, shards)
        placed.append(sharded is not program)
        return sharded

    try:
        sim = simulate_file(file, [path], model, shape=shape)
    except (CostError, OSError, PpsError, UsageError):
        return ""
    us = measured * 1e6
    model_flag = "" if model == "rendezvous" else f" --comm-model {model}"
    shown = f"ppdsl expand --fsdp {file} | ppdsl simulate -" if placed and placed[0] else f"ppdsl simulate {file}"
    return (f"; {shown} --costs {path}{model_flag}: makespan {num(sim.makespan)} us vs measured step {us:.0f} us "
            f"({(sim.makespan - us) / us * 100:+.1f}%)")
