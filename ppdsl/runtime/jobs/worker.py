"""One rank of `ppdsl run`: set up, agree with the other ranks, train, report.

Started by the local launcher (which passes a report pipe in PPDSL_REPORT_FD), by
`python -m paddle.distributed.launch` or by `torchrun` on a cluster (then it reports on
stdout/stderr).
Everything that can be checked alone (program, model factory, data, stage count) is checked
before any communication; the ranks then share their set-up verdict in one collective so
they all fail together with the same message.
"""

from __future__ import annotations

import logging
import os
import struct
import sys
import time
from collections.abc import Iterator
from typing import Any

from attrs import frozen

from ...diagnostics import PpsError, UsageError
from ...ir import Program
from ...wording import plural
from ...limits import DEFAULT_MAX_LOWERED_STEPS
from ...load import load_program
from ...semantics import CommModel
from . import models
from ..interpreter import values
from ..transport.comm import comm_model_of, gather_objects
from .devices import AUTO, CPU, Device, choose_device, local_position
from .notices import STORE_SECONDS, Teller
from ..framework import PADDLE, TORCH, Framework, get_framework
from .models import SetupFailure, build_stages, make_optimizer
from ..interpreter.plan import Plan, compile_rank, count_actions
from ..interpreter.preflight import prepare
from .progress import RankZeroProgress
from .process_layout import Layout
from .watchdog import Reporter, Watchdog


@frozen
class RunConfig:
    """Everything a rank needs; built from `ppdsl run`'s arguments."""

    files: tuple[str, ...]
    steps: int = 5
    max_steps: int | None = None  # the program's, as `--max-steps` (limits.DEFAULT_MAX_STEPS)
    model: str | None = None
    data: str | None = None
    loss: str | None = None
    optimizer: str = "sgd"
    lr: float = 0.05
    seed: int = 0
    timeout: float = 60.0
    verify: bool = False
    rtol: float = 1e-6
    profile: str | None = None
    scale_grads: bool = True
    warmup: int = 1
    split_backward: bool = True
    grad_guard: bool = True  # a used parameter without a gradient at the end of a step is an error
    verbose: bool = False  # each rank says which path its stages' weight gradients take
    framework: str = PADDLE
    background_sends: bool = True  # gloo: sends beside compute (`buffered`), else each waits (`rendezvous`)
    device: str = AUTO  # devices.REQUESTS; ppdsl's launcher passes the one it resolved
    data_parallel: int = 1  # replicas of the pipeline, each on its share of every batch
    fsdp: int = 1  # shards of every stage (FSDP2), each on its share of every batch, per replica
    tp: int = 1  # tensor-parallel ranks each stage is split over, all on the same rows
    clip_grad_norm: float | None = None  # clip by the global norm over the whole model before each optimizer step
    skip_nonfinite: bool = False  # a non-finite loss or gradient on any rank skips the step's optimizer on every rank


def data_members(cfg: RunConfig) -> int:
    """How many processes hold each pipeline rank, each training on its share of a batch."""
    return cfg.data_parallel * cfg.fsdp


# Where each launcher puts (this process's rank, the world size): Paddle's and torchrun's.
_RANK_VARIABLES = {PADDLE: ("PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM"), TORCH: ("RANK", "WORLD_SIZE")}


def rank_from_env(framework: str = PADDLE) -> tuple[int, int]:
    rank, world = _RANK_VARIABLES[framework]
    return int(os.environ[rank]), int(os.environ[world])


def in_distributed_env(framework: str = PADDLE) -> bool:
    """True in a rank started by a launcher (ppdsl's own, Paddle's, or torchrun)."""
    return all(v in os.environ for v in _RANK_VARIABLES[framework])


STARTUP_TIMEOUT = 60.0


class Setup:
    """What a rank builds before talking to anyone; `error` holds the first problem."""

    def __init__(self, cfg: RunConfig, file: str, rank: int, world: int, model: CommModel, fw: Framework):
        self.fw = fw
        self.error: str | None = None
        self.plan: Plan | None = None
        self.layout: Layout | None = None
        self.layers: dict[int, Any] = {}
        self.program: Any = None
        self.loss_fn: Any = None
        self.parallelize: Any = None
        self.batches: Iterator[tuple[Any, Any]] | None = None
        try:
            self._build(cfg, file, rank, world, model)
        except (UsageError, SetupFailure) as exc:
            self.error = str(exc)
        except PpsError as exc:
            self.error = "the program does not pass lint: " + "; ".join(
                f"{d.path}:{d.line}:{d.column}: [{d.code}] {d.message}" for d in exc.diagnostics)

    def _build(self, cfg: RunConfig, file: str, rank: int, world: int, model: CommModel) -> None:
        program = sharded_program(load_program(file, steps_limit=cfg.max_steps), cfg.fsdp)
        if program.ranks * data_members(cfg) * cfg.tp != world:
            replicas = f" x {cfg.data_parallel} replicas" if cfg.data_parallel > 1 else ""
            shards = f" x {cfg.fsdp} shards" if cfg.fsdp > 1 else ""
            tensor = f" x {cfg.tp} tensor-parallel ranks" if cfg.tp > 1 else ""
            raise SetupFailure(f"{file} is written for {plural(program.ranks, 'rank')}{replicas}{shards}{tensor} but "
                               f"{plural(world, 'process')} {'was' if world == 1 else 'were'} started")
        self.program = prepare(program, model)
        self.layout = Layout(program.ranks, data_members(cfg), rank, shards=cfg.fsdp, tensor=cfg.tp)
        self.plan = compile_rank(self.program, self.layout.pipeline_rank)
        # `ppdsl run` checked the contract (models.check_contract) before this process started.
        build = models.build_stage if cfg.model is None else models.load_callable(cfg.model, "model")
        self.parallelize = None if cfg.tp == 1 or cfg.model is None else models.tensor_plan(cfg.model)
        self.layers = build_stages(build, self.plan.local_stages, self.program.stages, cfg.seed,
                                   cfg.model or "built-in", self.fw)
        self.loss_fn = models.loss if cfg.loss is None else models.load_callable(cfg.loss, "loss")
        if cfg.data is None:
            self.batches = models.synthetic_batches(self.program.microbatches * data_members(cfg), cfg.seed,
                                                    framework=self.fw.name)
        else:
            source = models.load_callable(cfg.data, "data")
            try:
                self.batches = iter(source())
            except Exception as exc:  # noqa: BLE001
                raise SetupFailure(f"--data {cfg.data}: {type(exc).__name__}: {exc}") from None


def sharded_program(program: Program, shards: int) -> Program:
    """With `shards` > 1 (`--fsdp`), `program` with UNSHARD, RESHARD and REDUCE_GRAD placed by
    the lowering of `ppdsl expand --fsdp`, unless it places them itself."""
    from ...shard_actions import SHARD_KINDS, add_shard_actions

    if shards == 1 or any(a.kind in SHARD_KINDS for _, _, a in program.actions()):
        return program
    return add_shard_actions(program)


class Status:
    """(file, step, op index) in a small shared file, so the launcher can name the action of a
    rank that died without a word (killed, segfault)."""

    def __init__(self) -> None:
        self.mm: Any = None
        self.file = 0
        path = os.environ.get("PPDSL_STATUS_FILE")
        if path:
            import mmap

            with open(path, "r+b") as f:
                self.mm = mmap.mmap(f.fileno(), 12)

    def set(self, step: int, index: int) -> None:
        if self.mm is not None:
            struct.pack_into("iii", self.mm, 0, self.file, step, index)


def main(cfg: RunConfig) -> int:
    logging.basicConfig(level=logging.WARNING)
    rank, world = rank_from_env(cfg.framework)
    reporter = Reporter(rank)
    watchdog = Watchdog(cfg.timeout, reporter)
    teller = Teller(rank, world, reporter, cfg.verbose or bool(os.environ.get("PPDSL_DEBUG")))
    watchdog.on_timeout = teller.timed_out
    try:
        code = _main(cfg, rank, world, reporter, watchdog, teller)
        reporter.send("exit", code=code)
        return code
    except Exception as exc:  # noqa: BLE001 - every failure is told once (notices.py), never a bare traceback
        code = teller.fail(exc, watchdog.step, "")
        if teller.board is None:
            return code
        teller.exit(code)  # its threads may be blocked in the framework, on peers that are gone


def bind_device(fw: Framework, requested: str, rank: int, world: int) -> Device:
    """This process's device from the launcher's environment (`devices.choose_device`), bound.
    `DeviceError` (a usage error) when `requested` cannot be had."""
    local, size = local_position(os.environ, rank, world)
    if requested == CPU:  # asks the framework nothing
        device = choose_device(CPU, False, 0, local, size, os.environ)
    else:
        device = choose_device(requested, fw.cuda_built(), fw.device_count(), local, size, os.environ)
    fw.set_device(device)
    return device


def backend_from_env(framework: str = PADDLE, requested: str = AUTO) -> str:
    """The backend this rank will run on, its device bound first (the backend follows it)."""
    fw = get_framework(framework)
    rank, world = rank_from_env(framework)
    bind_device(fw, requested, rank, world)
    return fw.default_backend()


def apply_threads(fw: Framework) -> None:
    """The intra-op thread count the launcher chose (PPDSL_THREADS), for the framework's math library."""
    value = os.environ.get("PPDSL_THREADS", "")
    if value.isdigit() and int(value) > 0:
        fw.set_threads(int(value))


def _main(cfg: RunConfig, rank: int, world: int, reporter: Reporter, watchdog: Watchdog, teller: Teller) -> int:
    t_start = time.perf_counter()
    fw = get_framework(cfg.framework)
    bind_device(fw, cfg.device, rank, world)  # before the group: NCCL binds the same GPU
    backend = fw.default_backend()
    apply_threads(fw)
    # Joining waits for the slowest rank to import paddle: allow more than one P2P wait.
    saved, watchdog.timeout = watchdog.timeout, max(watchdog.timeout, STARTUP_TIMEOUT)
    watchdog.arm("starting the process group", "all ranks")
    if world > 1:  # one rank needs no group (and Paddle's collectives refuse a 1-rank default one)
        fw.init_process_group()
        teller.watch(lambda: fw.open_store(STORE_SECONDS))
    watchdog.disarm()
    watchdog.timeout = saved
    reporter.send("ready", seconds=time.perf_counter() - t_start)
    status = Status()
    code = 0
    for index, file in enumerate(cfg.files):
        status.file = index
        code = max(code, train(cfg, fw, file, index, rank, world, backend, reporter, watchdog, status))
        if code and not cfg.verify:
            break
    teller.close()
    if world > 1:
        fw.destroy_process_group()
    return code


def train(cfg: RunConfig, fw: Framework, file: str, index: int, rank: int, world: int, backend: str,
          reporter: Reporter, watchdog: Watchdog, status: Status) -> int:
    """Train `cfg.steps` steps with one schedule file: 0 when all went well, 1 when not."""
    watchdog.step = -1
    setup = Setup(cfg, file, rank, world, comm_model_of(backend, cfg.background_sends), fw)
    # One collective carries every rank's set-up verdict: all fail together, before any P2P.
    watchdog.arm("sharing set-up results", "all ranks")
    verdicts = gather_objects(fw, setup.error)
    watchdog.disarm()
    failed = [(r, e) for r, e in enumerate(verdicts) if e]
    if failed:
        r, e = failed[0]
        reporter.send("setup_error", file=index, step=-1, action="set-up", message=f"rank {r}: {e}")
        return 1
    assert setup.plan is not None and setup.batches is not None
    from ..interpreter.schedule import PipelineSchedule

    layout = setup.layout
    assert layout is not None
    if layout.sharded:
        # Every process at once (the mesh's groups span the job), after all set up well.
        watchdog.arm("sharding the stages (FSDP2)", "all ranks")
        fw.shard_stages(setup.layers, layout.replicas // layout.shards, layout.shards, layout.pipeline,
                        reshard_after_forward=not any(a.kind.name == "RESHARD" for _, _, a in setup.program.actions()))
        watchdog.disarm()
    if layout.tensor > 1:
        watchdog.arm("splitting the stages over their tensor-parallel ranks", "all ranks")
        fw.split_stages(setup.layers, layout.replicas, layout.pipeline, layout.tensor, setup.parallelize)
        watchdog.disarm()
    sched = PipelineSchedule(setup.program, setup.layers, setup.loss_fn, watchdog=watchdog, layout=layout,
                             backend=backend, scale_grads=cfg.scale_grads, profile=bool(cfg.profile),
                             split_backward=cfg.split_backward, framework=fw, background_sends=cfg.background_sends,
                             grad_guard=cfg.grad_guard)
    for message in sched.split_warnings:
        reporter.send("warning", file=index, message=message)
    params = [p for s in sorted(setup.layers) for _, p in fw.named_parameters(setup.layers[s])]
    optimizer = make_optimizer(cfg.optimizer, cfg.lr, params, fw) if params else None
    verifier = None
    if cfg.verify:
        from .verify import Verifier

        verifier = Verifier(cfg, setup, rank, world)
    if status.mm is not None:
        sched.mark = status.set
    progress = None
    if not reporter.attached and setup.plan.training:
        last = setup.program.placement[setup.program.stages - 1]
        progress = RankZeroProgress(fw, rank, last, cfg.steps, watchdog, backend == "gloo")
    step_times: list[float] = []
    counting: list[float] = []  # per step, the time --profile spent counting memory
    for step in range(cfg.steps):
        try:
            inputs, target = next(setup.batches)
        except StopIteration:
            break
        inputs, target = values.to_device(fw, inputs), values.to_device(fw, target)
        status.set(step, 0)
        losses: list[Any] = []
        t0, counted_before = time.perf_counter(), sched.memory.seconds
        mine, my_target = replica_share(fw, layout, inputs, target)
        sched.run_batch(mine, target=my_target, losses=losses)
        step_times.append(time.perf_counter() - t0)
        if cfg.verbose and step == 0:  # after a backward: what the graph split chose is known
            for s, path in sorted(sched.split_paths.items()):
                reporter.send("info", file=index, message=f"stage {s}: weight gradients: {path}")
        counting.append(sched.memory.seconds - counted_before)
        skipped = False
        if cfg.skip_nonfinite:
            watchdog.step = step
            watchdog.arm("checking that every rank's loss and gradients are finite", "all ranks")
            skipped = not sched.gradients_finite(losses if setup.plan.last_stage else [])
            watchdog.disarm()
        if setup.plan.last_stage and losses:
            rank_losses = [float(v) for v in losses]
            mean = sum(rank_losses) / len(rank_losses)
            if layout.replicas > 1:
                watchdog.arm("averaging the loss over the replicas", "the last stage's replicas")
                mean = mean_over_replicas(fw, sched.transport.data_parallel_group, mean, layout.replicas)
                watchdog.disarm()
            if layout.replica == 0 and layout.tensor_rank == 0:
                reporter.send("loss", file=index, step=step, loss=mean, losses=rank_losses, skipped=skipped)
        if progress is not None:  # rank 0 prints the step's loss (replica 0's last stage sends it the mean)
            watchdog.step = step
            progress.step(step, [mean] if setup.plan.last_stage and losses else [], skipped)
        if verifier is not None:
            watchdog.step = step
            watchdog.arm("comparing with the unpipelined model", "rank 0")
            verifier.check_step(step, inputs, target, losses)
            watchdog.disarm()
        if cfg.clip_grad_norm is not None and not skipped:
            watchdog.step = step
            watchdog.arm("clipping the gradients by their global norm", "all ranks")
            norm = sched.clip_grad_norm(cfg.clip_grad_norm)
            watchdog.disarm()
            if verifier is not None:
                verifier.clip(step, cfg.clip_grad_norm, norm)
        if optimizer is not None:
            if skipped:
                fw.clear_grads(optimizer)
            else:
                fw.optimizer_step(optimizer)
        if verifier is not None:
            verifier.optimizer_step(skipped)
    sched.close()  # its threads end now: none is left in the framework when the process exits
    if verifier is not None:
        verifier.finish(reporter, index)
    steady = step_times[cfg.warmup:] or step_times
    steady_counting = counting[cfg.warmup:] or counting
    reporter.send("done", file=index, step_times=step_times, step_time=sum(steady) / max(1, len(steady)),
                  counting_time=sum(steady_counting) / max(1, len(steady_counting)), actions=count_actions(setup.plan))
    if cfg.profile:
        from .profile import gather_profile

        gather_profile(sched, cfg, rank, reporter, index, optimizer)
    return 1 if verifier is not None and verifier.failure is not None else 0


def replica_share(fw: Framework, layout: Layout, inputs: Any, target: Any) -> tuple[Any, Any]:
    """This replica's rows of a global batch (the whole batch with one replica)."""
    if layout.replicas == 1:
        return inputs, target
    try:
        share = [None if v is None else values.split_batch(fw, v, layout.replicas, what)[layout.replica]
                 for v, what in ((inputs, "inputs"), (target, "target"))]
        return share[0], share[1]
    except values.StageValueError as exc:
        raise SetupFailure(f"the batch cannot be shared by {layout.replicas} replicas: {exc}") from None


def mean_over_replicas(fw: Framework, group: Any, value: float, replicas: int) -> float:
    """The mean of `value` over the members of a data-parallel group (a blocking collective)."""
    import numpy as np

    t = fw.from_numpy(np.array([value], dtype="float64"))
    fw.all_reduce(t, group)
    return float(fw.to_numpy(t)[0]) / replicas


def run_from_args(args: Any) -> int:
    if getattr(args, "threads", None) and "PPDSL_THREADS" not in os.environ:  # under Paddle's launcher
        os.environ["PPDSL_THREADS"] = str(args.threads)
    cfg = RunConfig(files=tuple(args.file), steps=args.steps, max_steps=getattr(args, "max_steps", None) or DEFAULT_MAX_LOWERED_STEPS, model=args.model, data=args.data, loss=args.loss,
                    optimizer=args.optimizer, lr=args.lr, seed=args.seed, timeout=args.timeout,
                    verify=args.verify, rtol=args.rtol, profile=args.profile, scale_grads=not args.sum_grads,
                    split_backward=not args.no_split_backward, framework=getattr(args, "framework", PADDLE),
                    grad_guard=not getattr(args, "no_grad_guard", False), verbose=getattr(args, "verbose", False),
                    background_sends=not getattr(args, "blocking_sends", False), device=getattr(args, "device", AUTO),
                    data_parallel=getattr(args, "data_parallel", 1), fsdp=getattr(args, "fsdp", 1),
                    tp=getattr(args, "tp", 1),
                    clip_grad_norm=getattr(args, "clip_grad_norm", None),
                    skip_nonfinite=getattr(args, "skip_nonfinite", False))
    code = main(cfg)
    sys.stdout.flush()
    return code
