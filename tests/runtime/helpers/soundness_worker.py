"""One rank of the soundness runs: many programs in turn in the same processes, on real gloo.

Started by `soundness.run` through the runtime's launcher, with a JSON file of cases. Each
case builds a `PipelineSchedule(check=False)` (and `_guard=False` when unguarded) and runs
one step in a thread, so a step that never finishes (a send nobody receives) leaves this
process free: the thread stays blocked on that case's own pair groups (each schedule makes
new ones), and the next case goes on with fresh groups. The ranks tell each other how their
step ended through small files in a shared directory (a rank stuck in gloo cannot answer a
collective); then rank 0 compares the gradients with the unpipelined model (`--verify`'s
`Verifier`) when every rank finished, and reports the case.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import paddle.distributed as dist

from ppdsl import parse
from ppdsl.runtime.jobs import models
from ppdsl.runtime.transport.comm import Transport
from ppdsl.runtime.framework import get_framework
from ppdsl.runtime.interpreter.schedule import MessageOrderError, PipelineSchedule
from ppdsl.runtime.jobs.verify import Verifier
from ppdsl.runtime.jobs.watchdog import Reporter, Watchdog
from ppdsl.runtime.jobs.worker import RunConfig, build_stages

NEVER = 1e9  # the launcher watches the whole run; a hung case must not end the process
BUDGET_SECONDS = 600.0  # the whole worker, whatever happens
SETTLE = 3.0  # how much longer a rank may sit in one wait when every rank that ended finished
CAP_SECONDS = 30.0  # one case, however busy the machine: then the ranks left count as stuck
EXACT = 1e-12  # float64: only rounding may differ


class _Setup:
    """What `Verifier` reads from the worker's set-up."""

    def __init__(self, program: Any, layers: dict[int, Any]):
        self.program, self.layers, self.loss_fn = program, layers, models.loss
        self.fw = get_framework("paddle")


def _status(exc: BaseException | None) -> str:
    if exc is None:
        return "done"
    kind = "order" if isinstance(exc, MessageOrderError) else "error"
    return f"{kind}: {exc}"


def _run_case(index: int, case: dict[str, Any], rank: int, world: int, reporter: Reporter, shared: Path,
              hang: float, clean: Transport | None) -> Transport | None:
    """Run one case; the pair groups it leaves in a clean state (every rank finished), or None."""
    program = parse(case["text"])
    reporter.send("case_start", index=index)
    if case.get("abort") and rank == 1:
        os.abort()
    t0 = time.monotonic()
    layers = build_stages(models.build_stage, program.stages_of(rank), program.stages, 0, "built-in")
    # "nccl" on these gloo groups: the runtime takes its NCCL path (a batch is one
    # batch_isend_irecv, labels first), which gloo then runs member by member as written.
    sched = PipelineSchedule(program, layers, models.loss, rank=rank, backend=case["backend"], check=False,
                             background_sends=bool(case.get("background")),
                             _guard=bool(case["guarded"]), watchdog=_Published(reporter, shared / f"{index}.{rank}.since"),
                             _transport=clean)
    t1 = time.monotonic()
    inputs, target = next(models.synthetic_batches(program.microbatches, seed=index))
    losses: list[Any] = []
    mine = shared / f"{index}.{rank}"

    def step() -> None:
        try:
            sched.step(inputs, target=target, losses=losses)
            status = _status(None)
        except BaseException as exc:  # noqa: BLE001 - every ending is the case's outcome
            status = _status(exc)
        tmp = shared / f"{index}.{rank}.tmp"
        tmp.write_text(status)
        tmp.rename(mine)

    thread = threading.Thread(target=step, daemon=True, name=f"case-{index}")
    thread.start()
    wd = sched.watchdog
    statuses = _wait_for_ending(index, world, shared, hang)
    t2 = time.monotonic()
    mine_status = statuses.get(rank, f"stuck at {wd.label} ({wd.what})" if wd.since else "stuck")
    everyone: list[Any] = []
    dist.all_gather_object(everyone, mine_status)
    outcome, detail = _outcome(everyone)
    if outcome == "completed":
        cfg = RunConfig(files=(), rtol=EXACT)
        verifier = Verifier(cfg, _Setup(program, layers), rank, world)
        verifier.check_step(0, inputs, target, losses)
        if rank == 0:
            outcome = "exact" if verifier.failure is None else "wrong"
            detail = verifier.failure or f"worst relative difference {verifier.worst:.1e}"
    if rank == 0:
        reporter.send("case", index=index, outcome=outcome, detail=detail, ranks=everyone,
                      seconds=[t1 - t0, t2 - t1, time.monotonic() - t2])
    return sched.transport if all(s == "done" for s in everyone) else None


class _Published(Watchdog):
    """A watchdog that never ends the process and writes, whenever its `since` changes (the
    transport arms it before each send or receive and zeroes it after), when the rank's
    current wait began (the host's monotonic clock, the same in every process; 0 while the
    rank computes) to a file the other ranks read. Written by the step's own thread, so the
    file is never behind the rank however busy the machine is."""

    def __init__(self, reporter: Reporter, path: Path):
        self.path, self._tmp = path, path.with_name(path.name + ".tmp")
        super().__init__(NEVER, reporter)

    @property
    def since(self) -> float:
        return self._since

    @since.setter
    def since(self, value: float) -> None:
        self._since = value
        self._tmp.write_text(repr(value))
        self._tmp.rename(self.path)


def _wait_for_ending(index: int, world: int, shared: Path, hang: float) -> dict[int, str]:
    """Each rank's final status once every rank has one, or once the ranks left have all sat
    in one send or receive for `hang` seconds (0.1 s when a rank has already stopped: then
    the others wait for it and never finish; SETTLE times `hang` when the ranks that ended all
    finished their step), or after CAP_SECONDS whatever happens.

    A hang is judged by the ranks being blocked (`_Published`), not by the clock alone: on a
    loaded machine (this test starts several launches at once on 2 cores) a case that is
    merely slow must not count as hung."""
    start = time.monotonic()
    statuses: dict[int, str] = {}
    while True:
        statuses = {r: (shared / f"{index}.{r}").read_text() for r in range(world) if (shared / f"{index}.{r}").exists()}
        now = time.monotonic()
        if len(statuses) == world or now - start > CAP_SECONDS:
            return statuses
        sinces = [_since(shared / f"{index}.{r}.since") for r in range(world) if r not in statuses]
        blocked = now - max(sinces) if all(sinces) else 0.0  # the shortest wait among them
        # A rank that stopped leaves the others waiting for it: 0.1 s tells. Ranks that finished
        # their step leave the rest far more likely slow than hung (a process the loaded machine
        # has not run since its wait ended still shows it): they get SETTLE times as long.
        wait = 0.1 if any(s != "done" for s in statuses.values()) else hang * SETTLE if statuses else hang
        if blocked >= wait:
            return statuses
        time.sleep(0.01)


def _since(path: Path) -> float:
    try:
        return float(path.read_text())
    except (OSError, ValueError):  # not written yet: that rank has not started waiting
        return 0.0


def _outcome(statuses: list[str]) -> tuple[str, str]:
    if all(s == "done" for s in statuses):
        return "completed", ""
    for prefix, outcome in (("order: ", "stopped"), ("error: ", "failed")):
        for s in statuses:
            if s.startswith(prefix):
                return outcome, s[len(prefix):]
    return "hung", "; ".join(f"rank {r} {s}" for r, s in enumerate(statuses) if s.startswith("stuck"))


def _budget() -> None:
    time.sleep(BUDGET_SECONDS)
    print("soundness worker: over its time budget", file=sys.stderr, flush=True)
    os._exit(3)


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    threading.Thread(target=_budget, daemon=True).start()
    rank, world = int(os.environ["PADDLE_TRAINER_ID"]), int(os.environ["PADDLE_TRAINERS_NUM"])
    reporter = Reporter(rank)
    dist.init_parallel_env()
    reporter.send("ready", seconds=0.0)
    shared = Path(spec["dir"])
    clean: Transport | None = None
    for index, case in enumerate(spec["cases"]):
        clean = _run_case(index, case, rank, world, reporter, shared, float(spec["hang_seconds"]), clean)
    reporter.send("exit", code=0)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # threads of hung cases are still blocked in gloo: do not wait for them


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
