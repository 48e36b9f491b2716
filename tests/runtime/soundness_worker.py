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
from ppdsl.runtime import models
from ppdsl.runtime.comm import Transport
from ppdsl.runtime.schedule import MessageOrderError, PipelineSchedule
from ppdsl.runtime.verify import Verifier
from ppdsl.runtime.watchdog import Reporter, Watchdog
from ppdsl.runtime.worker import RunConfig, build_stages

NEVER = 1e9  # the launcher watches the whole run; a hung case must not end the process
BUDGET_SECONDS = 600.0  # the whole worker, whatever happens
EXACT = 1e-12  # float64: only rounding may differ


class _Setup:
    """What `Verifier` reads from the worker's set-up."""

    def __init__(self, program: Any, layers: dict[int, Any]):
        self.program, self.layers, self.loss_fn = program, layers, models.loss


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
    t0 = time.monotonic()
    layers = build_stages(models.build_stage, program.stages_of(rank), program.stages, 0, "built-in")
    # "nccl" on these gloo groups: the runtime takes its NCCL path (a batch is one
    # batch_isend_irecv, labels first), which gloo then runs member by member as written.
    sched = PipelineSchedule(program, layers, models.loss, rank=rank, backend=case["backend"], check=False,
                             _guard=bool(case["guarded"]), watchdog=Watchdog(NEVER, reporter),
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
    deadline = time.monotonic() + hang
    statuses: dict[int, str] = {}
    while time.monotonic() < deadline:
        statuses = {r: (shared / f"{index}.{r}").read_text() for r in range(world) if (shared / f"{index}.{r}").exists()}
        if len(statuses) == world:
            break
        if any(s != "done" for s in statuses.values()):
            # One rank stopped (the guard, a shape): the others wait for it and never finish.
            deadline = min(deadline, time.monotonic() + 0.1)
        time.sleep(0.01)
    wd = sched.watchdog
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
