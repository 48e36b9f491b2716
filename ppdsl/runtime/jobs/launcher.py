"""Start one local process per rank (gloo over loopback) and watch them. No paddle here.

Each rank is `python -m ppdsl run ...` with Paddle's plain environment variables, a pipe for
its reports (JSON lines) and a tiny status file holding the step and action it is at. When a
rank reports an error or exits non-zero, the others are stopped at once and the first failure
is printed with its rank, step and action; a rank that died without a word (killed, crashed)
is named from its status file. Paddle's own log lines go to one file per rank.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from attrs import define, field

from ...wording import plural
from ...ir import Program
from ...lower import needs_lowering
from .devices import CPU_DEVICE, Device
from .failure import RAISED, Failure
from ..interpreter.plan import compile_rank
from .progress import progress_line

STARTUP_SECONDS = 60.0  # importing paddle and joining the group, on a busy machine
GRACE_SECONDS = 2.0


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@define
class FileOutcome:
    """One schedule file's run: per-step losses, the verify verdict, rank 0's step times."""

    losses: dict[int, float] = field(factory=dict)
    verify: dict[str, Any] | None = None
    step_time: float | None = None
    step_times: list[float] = field(factory=list)
    counting_time: float = 0.0  # per step, what --profile spent counting memory (the largest rank's)
    actions: dict[int, int] = field(factory=dict)
    memory: list[dict[str, Any]] = field(factory=list)  # per rank, with --profile


@define
class Outcome:
    """What the launcher saw: each file's results, and the first failure."""

    code: int = 0
    files: dict[int, FileOutcome] = field(factory=dict)
    failure: str | None = None
    # The failure as its rank told it (None for a death the launcher saw, or a set-up refusal),
    # and its traceback: what `ppdsl run` prints of it (`Failure.block`).
    root: Failure | None = None
    traceback: str = ""
    # Every failure seen, (rank of importance, message, as told): a rank's own exception or death
    # ranks 0; a rank that only lost its peer (a broken connection, a timeout) ranks 1.
    failures: list[tuple[int, str, Failure | None, str]] = field(factory=list)
    told: set[int] = field(factory=set)  # the ranks that told of a failure, theirs or another's
    profile: dict[str, Any] | None = None
    warnings: list[str] = field(factory=list)
    events: list[dict[str, Any]] = field(factory=list)
    exits: dict[int, int] = field(factory=dict)  # rank -> the exit status it announced

    def file(self, index: int) -> FileOutcome:
        return self.files.setdefault(index, FileOutcome())


class Progress:
    """A one-line bar on a terminal, one line per step otherwise."""

    def __init__(self, steps: int, stream: TextIO, quiet: bool, names: list[str]):
        self.steps, self.stream, self.quiet, self.names = steps, stream, quiet, names
        self.tty = stream.isatty()

    def _prefix(self, file: int) -> str:
        return f"{self.names[file]}: " if len(self.names) > 1 and file < len(self.names) else ""

    def verdict(self, file: int, v: dict[str, Any]) -> None:
        if self.quiet:
            return
        if v.get("ok"):
            text = (f"verify ok: losses and {v.get('tensors')} gradients over {plural(int(v.get('steps', 0)), 'step')} match the "
                    f"unpipelined model (worst relative difference {float(v.get('worst', 0.0)):.1e})")
        else:
            text = f"verify FAILED: {v.get('message')}"
        self.stream.write(f"{self._prefix(file)}{text}\n")
        self.stream.flush()

    def step(self, file: int, step: int, loss: float, skipped: bool = False) -> None:
        if self.quiet:
            return
        prefix = self._prefix(file)
        if self.tty:
            width = 24
            done = int(width * (step + 1) / max(1, self.steps))
            bar = "#" * done + "." * (width - done)
            end = "\n" if step + 1 >= self.steps else ""
            self.stream.write(f"\r{prefix}[{bar}] {progress_line(step, self.steps, loss, skipped)}{end}")
        else:
            self.stream.write(f"{prefix}{progress_line(step, self.steps, loss, skipped)}\n")
        self.stream.flush()

    def close(self) -> None:
        pass


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[2])


def cores() -> int:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def threads_per_rank(ranks: int, requested: int | None = None) -> tuple[int, str]:
    """Intra-op threads for each of `ranks` local processes, and where the number came from.

    So that ranks x threads <= cores: N ranks each using every core (Paddle's default) fight
    over them. `requested` (`--threads`) wins, then OMP_NUM_THREADS from the environment."""
    if requested is not None:
        return requested, "--threads"
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env), "OMP_NUM_THREADS"
    return max(1, cores() // max(1, ranks)), f"{plural(cores(), 'core')} / {plural(ranks, 'rank')}"


def oversubscription(ranks: int, threads: int, available: int | None = None) -> str | None:
    """What to warn of when `ranks` local processes of `threads` intra-op threads each want
    more cores than there are (`available`, default: the cores this process may run on); None
    when they fit. Oversubscribed ranks do not fail: each waits for cores the others hold, and
    a step takes several times longer, which reads as a slow schedule."""
    n = cores() if available is None else available
    # One thread a rank is the least there is: more ranks than cores is what the schedule asks
    # of this machine, and the run's first line already says so.
    if ranks * threads <= n or threads == 1:
        return None
    advice = (f"--threads {n // ranks} fits" if ranks <= n else
              f"even --threads 1 puts {plural(ranks, 'rank')} on {plural(n, 'core')}: fewer ranks or more cores")
    return (f"{plural(ranks, 'rank')} x {plural(threads, 'thread')} = {ranks * threads} threads on "
            f"{plural(n, 'core')}: they compete for the cores and every step slows; {advice}")


def launch(programs: Sequence[Program], argv: Sequence[str], *, steps: int, timeout: float, quiet: bool = False,
           stream: TextIO | None = None, keep_logs: str | None = None, names: Sequence[str] = (),
           command: Sequence[str] | None = None, threads: int | None = None,
           device: Device = CPU_DEVICE, replicas: int = 1, tensor: int = 1) -> Outcome:
    """Run `ppdsl run argv...` as local processes (one per rank of each of `replicas` copies
    of the pipeline, numbered as `process_layout.Layout` says) and collect what they report.

    `programs` are the prepared programs of the files in argv, in order; all have the same
    number of ranks. `command` replaces `python -m ppdsl run` (e.g. a script using the API).
    Each rank gets `threads` intra-op threads (default: `threads_per_rank`) and, when `device`
    is a GPU, GPU `rank` and NCCL (the caller checked there are enough)."""
    out = stream or sys.stdout
    n = programs[0].ranks * replicas
    if threads is None:
        threads = threads_per_rank(n)[0]
    tmp = Path(tempfile.mkdtemp(prefix="ppdsl-run-"))
    ports = free_ports(n)
    endpoints = ",".join(f"127.0.0.1:{p}" for p in ports)
    procs: list[subprocess.Popen[bytes]] = []
    readers: dict[int, int] = {}
    logs: list[Path] = []
    outcome = Outcome()
    progress = Progress(steps, out, quiet, list(names))
    sel = selectors.DefaultSelector()
    try:
        for rank in range(n):
            status = tmp / f"status.{rank}"
            status.write_bytes(b"\xff" * 12)
            log = tmp / f"rank{rank}.log"
            logs.append(log)
            r, w = os.pipe()
            env = dict(os.environ)
            env.update({
                "PADDLE_TRAINERS_NUM": str(n), "PADDLE_TRAINER_ENDPOINTS": endpoints,
                "PADDLE_TRAINER_ID": str(rank), "PADDLE_CURRENT_ENDPOINT": f"127.0.0.1:{ports[rank]}",
                "PADDLE_DISTRI_BACKEND": device.backend, "PPDSL_REPORT_FD": str(w), "PPDSL_STATUS_FILE": str(status),
                # torch.distributed's env:// rendezvous (only the chosen framework listens).
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(ports[0]), "RANK": str(rank),
                "WORLD_SIZE": str(n), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(n),
                "PYTHONPATH": os.pathsep.join(filter(None, [_package_root(), env.get("PYTHONPATH")])),
            })
            if device.is_gpu:  # what Paddle's launcher writes for its ranks (`devices.assigned_gpu`)
                env["FLAGS_selected_gpus"] = str(rank)
            env.setdefault("GLOG_minloglevel", "2")  # Paddle's INFO lines
            # A native crash (a signal the framework does not handle itself) leaves the Python
            # stack of every thread in the rank's log.
            env.setdefault("PYTHONFAULTHANDLER", "1")
            # N ranks share this machine's cores; read before paddle loads its math library.
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = env["PPDSL_THREADS"] = str(threads)
            with open(log, "wb") as logf:
                base = list(command) if command is not None else [sys.executable, "-m", "ppdsl", "run"]
                proc = subprocess.Popen([*base, *argv], env=env,
                                        stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                        pass_fds=(w,))
            os.close(w)
            os.set_blocking(r, False)
            procs.append(proc)
            readers[r] = rank
            sel.register(r, selectors.EVENT_READ, rank)
        _watch(procs, sel, readers, outcome, progress, programs, tmp, timeout, tensor)
    except KeyboardInterrupt:
        outcome.failure = outcome.failure or "interrupted"
        outcome.code = 130
        raise
    finally:
        _stop(procs)
        for fd in list(readers):
            try:
                sel.unregister(fd)
            except (KeyError, ValueError):
                pass
            os.close(fd)
        sel.close()
        progress.close()
        if outcome.failure is not None and not quiet:
            _print_tails(logs, out)
        if keep_logs:
            Path(keep_logs).mkdir(parents=True, exist_ok=True)
            for log in logs:
                shutil.copy(log, Path(keep_logs) / log.name)
        shutil.rmtree(tmp, ignore_errors=True)
    return outcome


def _watch(procs: list[subprocess.Popen[bytes]], sel: selectors.BaseSelector, readers: dict[int, int],
           outcome: Outcome, progress: Progress, programs: Sequence[Program], tmp: Path, timeout: float,
           tensor: int = 1) -> None:
    n = len(procs)
    buffers = {fd: b"" for fd in readers}
    ready: set[int] = set()
    started = time.monotonic()
    exited: dict[int, int] = {}
    grace: float | None = None
    fd_of = {rank: fd for fd, rank in readers.items()}
    open_fds = set(readers)

    def pump(fd: int) -> None:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                return
            if not chunk:
                if fd in open_fds:
                    open_fds.discard(fd)
                    sel.unregister(fd)
                return
            buffers[fd] += chunk
            *lines, buffers[fd] = buffers[fd].split(b"\n")
            for line in lines:
                if line.strip():
                    _event(json.loads(line), outcome, progress, ready)

    while len(exited) < n:
        for key, _ in sel.select(timeout=0.1):
            pump(int(key.fd))
        for rank, proc in enumerate(procs):
            if rank in exited:
                continue
            code = proc.poll()
            if code is None:
                continue
            exited[rank] = code
            if fd_of[rank] in open_fds:
                pump(fd_of[rank])  # what it said before exiting comes first
            if code != 0 and rank not in outcome.exits and rank not in outcome.told:
                outcome.failures.append((0, _death(rank, code, programs, tmp, tensor), None, ""))
        if outcome.failures:
            # The first report is often a peer's "connection lost"; give the rank that really
            # failed a moment to say so (or to be seen dead) and report the root cause.
            if grace is None:
                grace = time.monotonic() + GRACE_SECONDS
            if min(f[0] for f in outcome.failures) == 0 or time.monotonic() > grace:
                _root(outcome)
                return
        if len(ready) < n and time.monotonic() - started > STARTUP_SECONDS + timeout:
            missing = sorted(set(range(n)) - ready)
            outcome.failure = (f"rank {missing[0]} did not start within {STARTUP_SECONDS + timeout:g} s "
                               "(importing paddle and joining the group)")
            outcome.code = 1
            return
    for fd in list(open_fds):
        pump(fd)
    if outcome.failures and outcome.failure is None:
        _root(outcome)
    verdicts = [f.verify for f in outcome.files.values() if f.verify is not None]
    if any(not v.get("ok") for v in verdicts):
        outcome.code = 1
    if outcome.failure is not None:
        outcome.code = 1


def _event(e: dict[str, Any], outcome: Outcome, progress: Progress, ready: set[int]) -> None:
    outcome.events.append(e)
    kind = e.get("event")
    rank = int(e.get("rank", -1))
    f = outcome.file(int(e.get("file", 0)))
    if kind == "ready":
        ready.add(rank)
    elif kind == "loss":
        f.losses[int(e["step"])] = float(e["loss"])
        progress.step(int(e.get("file", 0)), int(e["step"]), float(e["loss"]), bool(e.get("skipped")))
    elif kind in ("error", "timeout", "setup_error"):
        outcome.told.add(rank)
        failure = Failure.from_dict(e["failure"]) if "failure" in e else None
        if failure is not None:
            outcome.failures.append((0 if failure.kind == RAISED else 1, failure.headline, failure,
                                     str(e.get("traceback", ""))))
        else:
            message = str(e.get("message"))
            if kind == "timeout":
                message = f"rank {rank}: {message}"
            outcome.failures.append((1 if kind == "timeout" or e.get("peer") else 0, message, None, ""))
    elif kind == "stopped":  # for another rank's failure, which that rank reports itself
        outcome.told.add(rank)
    elif kind == "verify":
        f.verify = e
        progress.verdict(int(e.get("file", 0)), e)
    elif kind == "done":
        ready.add(rank)
        f.actions[rank] = int(e.get("actions", 0))
        # Any rank's memory count delays the others through their receives: the largest.
        f.counting_time = max(f.counting_time, float(e.get("counting_time", 0.0)))
        if rank == 0:
            f.step_time = float(e.get("step_time", 0.0))
            f.step_times = list(e.get("step_times", []))
    elif kind == "profile":
        outcome.profile = e
        f.memory = list(e.get("memory", []))
    elif kind == "warning":
        message = f"rank {rank}: {e.get('message')}"
        if message not in outcome.warnings:  # once per layer, however many files run
            outcome.warnings.append(message)
            print(f"ppdsl run: warning: {message}", file=sys.stderr, flush=True)
    elif kind == "info":
        message = f"rank {rank}: {e.get('message')}"
        if message not in outcome.warnings:
            outcome.warnings.append(message)
            print(f"ppdsl run: {message}", file=sys.stderr, flush=True)
    elif kind == "exit":
        outcome.exits[rank] = int(e.get("code", 0))


def _root(outcome: Outcome) -> None:
    """The root cause among the failures seen: the first of the most important."""
    _, outcome.failure, outcome.root, outcome.traceback = min(outcome.failures, key=lambda f: f[0])
    outcome.code = 1


def _death(rank: int, code: int, programs: Sequence[Program], tmp: Path, tensor: int = 1) -> str:
    """A rank exited non-zero without reporting: name where it was from its status file."""
    how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
    try:
        raw = (tmp / f"status.{rank}").read_bytes()
        file, step, index = (int.from_bytes(raw[i:i + 4], "little", signed=True) for i in (0, 4, 8))
    except (OSError, ValueError):
        file, step, index = -1, -1, -1
    if step < 0 or not 0 <= file < len(programs):
        return f"rank {rank} {how} before its first step"
    program = programs[file]
    # Global rank (replica * P + pipeline rank) * tensor + tensor rank (`process_layout.Layout`).
    ops = compile_rank(program, (rank // tensor) % program.ranks).ops if not needs_lowering(program) else ()
    label = ops[index].label if 0 <= index < len(ops) else f"action #{index}"
    return f"rank {rank} {how} at step {step}, action {label}"


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    live = [p for p in procs if p.poll() is None]
    for p in live:
        p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 3.0
    for p in live:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _print_tails(logs: list[Path], out: TextIO) -> None:
    """The last lines of a rank's log when it holds a Python traceback (PPDSL_DEBUG=1)."""
    if not os.environ.get("PPDSL_DEBUG"):
        return
    for rank, log in enumerate(logs):
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError:
            continue
        if lines:
            print(f"--- rank {rank} log (last 20 lines) ---", file=sys.stderr)
            print("\n".join(lines[-20:]), file=sys.stderr)
