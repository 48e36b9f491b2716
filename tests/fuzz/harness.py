"""The fuzz harness: inputs made from real schedules, run through every command in a worker.

An input is one file (`.pps`, `.csv`, a cost string or a JSON profile) and the command it
goes through. A worker process runs `ppdsl.cli.main` on it in-process, under an address-space
limit (resource.setrlimit), and reports the exit code, what it printed and its CPU time; the
parent kills a worker that passes the wall-clock limit and starts another. What counts as a
defect (issue 14): an internal error or a traceback, a MemoryError, a worker that dies, an
exit code other than 0/1/2, more than `SLOW_SECONDS` of CPU in the command on an input under
1 MB (the harness's own read-back of what `convert` wrote is not counted), and a `convert`
whose output does not read back to the same program.

`scripts/fuzz.py` drives it for N inputs; `tests/fuzz/test_fuzz.py` runs a few hundred under
Hypothesis.
"""

from __future__ import annotations

import contextlib
import gc
import io
import multiprocessing
import multiprocessing.connection
import os
import random
import resource
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from attrs import frozen

ROOT = Path(__file__).resolve().parents[2]
SCHEDULES = ROOT / "schedules"

# CPU seconds on an input under 1 MB: a file may write out one step for every 4 bytes beyond its
# command's limit (limits.WRITTEN_STEP_BYTES), so such an input may hold ~225,000 steps more than
# the limit, which `show --svg` draws at up to 35 us a step.
SLOW_SECONDS = 20.0
WALL_SECONDS = 60.0         # a worker past this is killed: a hang (the machine may be loaded)
MEMORY_BYTES = 3 * 2**30    # address space of a worker
# A program makes only so many steps beyond what it writes out unless a flag says more
# (limits.DEFAULT_MAX_STEPS), so every slow input is a defect; its program's size is reported with it.
MAX_INPUT = 900_000  # bytes: the time rule is for inputs under 1 MB

COMMANDS = ("lint", "fmt", "expand", "expand --comms", "simulate", "show", "show --svg", "convert to csv",
            "convert to pps", "simulate --costs", "simulate --profile")
OUTCOMES_OK = ("exit 0", "exit 1", "exit 2")
GENERATORS = ("gpipe", "1f1b", "interleaved_1f1b", "looped_bfs", "zb1p", "zb2p", "zbv", "v_half", "v_min",
              "dualpipev")


@frozen
class Case:
    """One input: the command, the file's name (its extension picks the format) and bytes."""

    command: str
    name: str
    data: bytes

    def reproducer(self) -> str:
        argv = " ".join(argv_for(self.command, self.name, "OUT"))
        return f"ppdsl {argv}   # {self.name} = {self.data[:300]!r}{' ...' if len(self.data) > 300 else ''}"


@frozen
class Result:
    case: Case
    outcome: str  # exit 0/1/2, or a defect: internal error, memory, died, hang, slow, round trip, bad exit
    seconds: float
    detail: str = ""
    actions: int = 0

    @property
    def defect(self) -> bool:
        return self.outcome not in OUTCOMES_OK


# ---- inputs ------------------------------------------------------------------------------

def seed_texts() -> dict[str, list[str]]:
    """Real schedules to mutate, by kind: the shipped files, generator headers, their CSVs,
    cost strings and profiles."""
    from ppdsl.diagnostics import PpsError
    from ppdsl.profiles import profile_json
    from ppdsl.formats.torch_csv import write_csv
    from ppdsl.expansion import parse

    pps = [p.read_text() for p in sorted(SCHEDULES.glob("*.pps"))]
    pps += [f"pipeline ranks={r} microbatches={m}\nuse {g}()\n" for g in GENERATORS for r, m in ((2, 4), (4, 8))]
    pps += ["pipeline ranks=2 microbatches=2\nrank 0: 0F{0..1} [0F{0..1} 0B{0..1}] (0F1;0B0) <0SEND_F0 0RECV_B0>\n"
            "rank 1: 1F0 1B0 1F1 1B1\ncosts F=1 B=2 comm=0.1\n"]
    csv = []
    for text in pps[:12]:
        try:
            program = parse(text)
        except Exception:  # noqa: BLE001 - a seed that does not parse is just not used
            continue
        for dialect in ("current", "legacy"):
            try:
                csv.append(write_csv(program, dialect)[0])
            except PpsError:  # actions PyTorch's CSV has no name for (an offload): no CSV seed
                break
    costs = ["F=1,B=2,W=1,comm=0.1", "F=1 B=3 W=1", "F_s1=2,bytes=4194304,bandwidth=2.6e6", "overlap=0.5,F=2",
             "I=1,W=1"]
    profiles = [profile_json({"F": 1.0, "B": 2.0, "comm": 0.1}, "ms"),
                profile_json({}, "us", [{"kind": "F", "stage": 0, "duration": 1.5},
                                        {"kind": "SEND_F", "stage": 0, "duration": 0.2},
                                        {"kind": "I", "stage": 1, "duration": 2}])]
    return {"pps": pps, "csv": csv, "costs": costs, "profile": profiles}


# Numbers that broke or nearly broke something: limits, word sizes, float edges.
INTERESTING = ("0", "1", "2", "7", "65535", "65536", "65537", "1048576", "1048577", "4294967296",
               "18446744073709551616", "9" * 40, "9" * 400, "9" * 5000, "1e-320", "1e-9", "1e308", "1e999",
               "nan", "inf", "-1", "-0", "0.5", "1e12", "1e13", "20000001", "0x10", "1_000")
JUNK = ("{", "}", "[", "]", "(", ")", "<", ">", ";", ",", "=", ":", "..", "\n", "\r", "\t", " ", "#", "\0",
        "\ufeff", "\u2028", "é", "F", "B", "I", "W", "SEND_F", "RECV_B", "UNSHARD", "REDUCE_GRAD", "rank", "use",
        "pipeline", "costs", "placement=v", "stages=3", "mode=inference", "memory=2", "virtual=2", "_", "-")


def mutate(text: str, rng: random.Random) -> bytes:
    """A few edits of a real input: byte-level and token-aware (numbers swapped for edge
    values, tokens and lines duplicated, junk inserted)."""
    import re

    s = text
    for _ in range(rng.choice((1, 1, 2, 3, 5))):
        op = rng.randrange(9)
        if op == 0:  # a number -> an edge value
            numbers = list(re.finditer(r"\d+(?:\.\d+)?(?:e-?\d+)?", s))
            if numbers:
                m = rng.choice(numbers)
                s = s[:m.start()] + rng.choice(INTERESTING) + s[m.end():]
        elif op == 1:  # junk at a random place
            i = rng.randrange(len(s) + 1)
            s = s[:i] + rng.choice(JUNK) + s[i:]
        elif op == 2 and s:  # delete a run
            i = rng.randrange(len(s))
            s = s[:i] + s[i + rng.randint(1, 8):]
        elif op == 3:  # duplicate a line (rows given twice, headers twice)
            lines = s.split("\n")
            i = rng.randrange(len(lines))
            lines.insert(i, lines[i])
            s = "\n".join(lines)[:MAX_INPUT]
        elif op == 4:  # repeat a token many times (long rows)
            words = s.split(" ")
            i = rng.randrange(len(words))
            words[i] = " ".join([words[i]] * rng.choice((10, 100, 2000)))
            s = " ".join(words)[:MAX_INPUT]
        elif op == 5:  # swap two lines
            lines = s.split("\n")
            if len(lines) > 1:
                i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
                lines[i], lines[j] = lines[j], lines[i]
                s = "\n".join(lines)
        elif op == 6:  # truncate
            s = s[:rng.randrange(len(s) + 1)]
        elif op == 7:  # a random character
            i = rng.randrange(len(s) + 1)
            s = s[:i] + chr(rng.choice((rng.randrange(32), rng.randrange(32, 127), rng.randrange(128, 0x3000)))) + s[i:]
        else:  # a grammar-made action: stage, kind, microbatch with edge numbers
            i = rng.randrange(len(s) + 1)
            kind = rng.choice(("F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "UNSHARD", "RESHARD",
                               "REDUCE_GRAD", "X"))
            action = f"{rng.choice(INTERESTING[:12])}{kind}{rng.choice(INTERESTING[:12])}"
            s = s[:i] + f" {action} " + s[i:]
    data = s.encode("utf-8", "surrogatepass")
    if rng.random() < 0.05:  # byte-level: flip one byte (invalid UTF-8, NUL...)
        b = bytearray(data or b"\0")
        b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        data = bytes(b)
    if rng.random() < 0.02:
        data = data.decode("utf-8", "replace").encode("utf-16")
    return data


def grammar_pps(rng: random.Random) -> bytes:
    """A `.pps` file made from the grammar: a header with random options, then rows or a
    generator, with ranges, zips, pairs and batches (mostly valid, always plausible)."""
    ranks = rng.choice((1, 2, 3, 4))
    mbs = rng.choice((1, 2, 4))
    opts = [f"ranks={ranks}", f"microbatches={mbs}"]
    if rng.random() < 0.3:
        opts.append(rng.choice(("placement=v", "placement=loop", f"stages={2 * ranks}", "mode=inference",
                                "memory=3", f"placement=[{','.join(str(r % ranks) for r in range(ranks))}]")))
    lines = ["pipeline " + " ".join(opts)]
    if rng.random() < 0.4:
        args = rng.choice(("", "virtual=2", "virtual=3", "budget=2", "chunks=2"))
        lines.append(f"use {rng.choice(GENERATORS)}({args})")
    else:
        for r in range(ranks):
            items = []
            for _ in range(rng.randint(0, 6)):
                s = rng.choice((r, r, rng.randrange(ranks + 1)))
                k = rng.choice(("F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B"))
                shape = rng.randrange(5)
                if shape == 0:
                    items.append(f"{s}{k}{{0..{mbs - 1}}}")
                elif shape == 1:
                    items.append(f"[{s}F{{0..{mbs - 1}}} {s}B{{0..{mbs - 1}}}]")
                elif shape == 2:
                    items.append(f"({s}F{rng.randrange(mbs)};{s}B{rng.randrange(mbs)})")
                elif shape == 3:
                    items.append(f"<{s}SEND_F{rng.randrange(mbs)} {s}RECV_B{rng.randrange(mbs)}>")
                else:
                    items.append(f"{s}{k}{rng.randrange(mbs)}")
            lines.append(f"rank {r}: " + " ".join(items))
    if rng.random() < 0.3:
        lines.append("costs " + rng.choice(("F=1 B=2", "F=1 W=0.5", "comm=0.1", "F_s0=2")))
    return ("\n".join(lines) + "\n").encode()


def make_case(rng: random.Random, seeds: dict[str, list[str]], command: str | None = None) -> Case:
    command = command or rng.choice(COMMANDS)
    if command == "simulate --costs":
        return Case(command, "costs.txt", mutate(rng.choice(seeds["costs"]), rng))
    if command == "simulate --profile":
        return Case(command, "profile.json", mutate(rng.choice(seeds["profile"]), rng))
    if command == "convert to pps" or (command != "fmt" and rng.random() < 0.25):
        return Case(command, "in.csv", mutate(rng.choice(seeds["csv"]), rng))
    if rng.random() < 0.3:
        data = grammar_pps(rng)
        return Case(command, "in.pps", mutate(data.decode(), rng) if rng.random() < 0.5 else data)
    return Case(command, "in.pps", mutate(rng.choice(seeds["pps"]), rng))


def argv_for(command: str, name: str, out: str) -> list[str]:
    base = {"lint": ["lint", name], "fmt": ["fmt", "--check", name], "expand": ["expand", name],
            "expand --comms": ["expand", "--comms", name], "simulate": ["simulate", name],
            "show": ["show", "--no-color", "--width", "100", name], "show --svg": ["show", name, "--svg", f"{out}.svg"],
            "convert to csv": ["convert", name, f"{out}.csv"], "convert to pps": ["convert", name, f"{out}.pps"]}
    if command in base:
        return base[command]
    schedule = str(SCHEDULES / "zbv.pps")
    if command == "simulate --costs":
        return ["simulate", schedule, "--costs", "@" + name]  # the text of the file (see _run_one)
    if command == "simulate --profile":
        return ["simulate", schedule, "--costs", name]
    raise KeyError(f"no fuzz command `{command}`")


# ---- the worker -------------------------------------------------------------------------------

def _run_one(case: Case, workdir: Path) -> tuple[str, str, float]:
    """In the worker: (outcome, detail, CPU seconds of the command) of one case. The seconds
    are the command's own: the harness's check of what `convert` wrote reads the files again
    and is not the command's time."""
    from ppdsl.cli import main
    from ppdsl.load import load_program

    for leftover in workdir.iterdir():
        if leftover.is_file():
            leftover.unlink()
    path = workdir / case.name
    path.write_bytes(case.data)
    argv = argv_for(case.command, str(path), str(workdir / "out"))
    argv = [a if not a.startswith("@") else Path(a[1:]).read_bytes().decode("utf-8", "replace") for a in argv]
    out, err = io.StringIO(), io.StringIO()
    old_env = os.environ.pop("PPDSL_DEBUG", None)
    try:
        start = time.process_time()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            finally:
                seconds = time.process_time() - start
    except MemoryError:
        return "memory", "MemoryError escaped main()", 0.0
    except BaseException as exc:  # noqa: BLE001 - anything escaping main() is a defect
        return "internal error", f"{type(exc).__name__} escaped main(): {traceback.format_exc()[-800:]}", 0.0
    finally:
        if old_env is not None:
            os.environ["PPDSL_DEBUG"] = old_env
    text = err.getvalue()
    if "internal error" in text or "Traceback" in text:
        kind = "memory" if "MemoryError" in text else "internal error"
        return kind, text[-800:], seconds
    if code not in (0, 1, 2):
        return "bad exit", f"exit {code}: {text[-300:]}", seconds
    if case.command.startswith("convert") and code == 0:
        written = workdir / ("out.csv" if case.command.endswith("csv") else "out.pps")
        problem = _round_trip(path, written, load_program, lossy="warning[PPS031]" in text)
        if problem:
            return "round trip", problem, seconds
    return f"exit {code}", "", seconds


def _same(a: Any, b: Any, lossy: bool) -> bool:
    """The same program; after a loss convert warned about (PPS031: batches split, a header
    a CSV has no place for), the same shape."""
    shape = a.ranks == b.ranks and a.stages == b.stages and a.placement == b.placement
    return bool(shape and (lossy or (a.rows == b.rows and a.microbatches == b.microbatches and a.mode == b.mode)))


def _round_trip(source: Path, written: Path, load: Any, lossy: bool) -> str:
    """What `convert` wrote must read back to the program it was made from."""
    from ppdsl.diagnostics import PpsError, UsageError

    try:
        original = load(str(source))
    except (PpsError, UsageError):
        return "convert wrote a file from an input that does not load"
    try:
        back = load(str(written))
    except (PpsError, UsageError) as exc:
        return f"convert's output does not read back: {str(exc)[:300]}"
    if not _same(original, back, lossy):
        return "convert's output reads back to another program"
    return ""


class _SizeTimeout(Exception):
    pass


def _count_actions(case: Case, workdir: Path) -> int:
    """The steps the input's program has (0: none, or not found within a few seconds)."""
    import signal

    from ppdsl.load import load_program

    if not case.name.endswith((".pps", ".csv")):
        return 0
    path = workdir / case.name
    path.write_bytes(case.data)

    def stop(signum: int, frame: object) -> None:
        raise _SizeTimeout

    old = signal.signal(signal.SIGPROF, stop)
    signal.setitimer(signal.ITIMER_PROF, 3.0)
    try:
        return load_program(str(path)).action_count
    except BaseException:  # noqa: BLE001 - only a size for the report (a timeout, a bad input)
        return 0
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)


def _may_be_big(case: Case) -> bool:
    """Can a small input ask for many steps? A generator or a range can (rows cannot: they
    hold no more steps than words)."""
    return b"use" in case.data or b".." in case.data or len(case.data) > 400_000


def _worker(conn: multiprocessing.connection.Connection, memory: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    workdir = Path(tempfile.mkdtemp(prefix="ppdsl-fuzz-"))
    import ppdsl.cli  # noqa: F401 - import once, before the clock starts
    try:
        while True:
            case = conn.recv()
            if case is None:
                break
            actions = _count_actions(case, workdir) if _may_be_big(case) else 0
            conn.send(("size", actions))
            # A command starts in a fresh process: the previous inputs' cyclic garbage is not
            # its cost. Left alone, it piles up to ~2M objects over a few thousand inputs and
            # Python's full collections inside the next big input doubled its time (measured:
            # 2.2 s alone, 4.1 s after 3,000 others).
            gc.collect()
            start = time.process_time()
            try:
                outcome, detail, seconds = _run_one(case, workdir)
            except MemoryError:
                outcome, detail, seconds = "memory", "MemoryError in the harness", time.process_time() - start
            if seconds > SLOW_SECONDS and len(case.data) < 2**20 and outcome in OUTCOMES_OK:
                outcome = "slow"
                detail = f"{seconds:.1f} s of CPU, {actions} actions"
            conn.send((outcome, detail, seconds, actions))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


class Pool:
    """Workers that run cases; a worker that hangs or dies is replaced."""

    def __init__(self, size: int = 1, memory: int = MEMORY_BYTES, wall: float = WALL_SECONDS):
        self.memory = memory
        self.wall = wall
        self.ctx = multiprocessing.get_context("fork")
        self.workers: list[tuple[Any, multiprocessing.connection.Connection]] = [self._start() for _ in range(size)]

    def _start(self) -> tuple[Any, multiprocessing.connection.Connection]:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker, args=(child, self.memory), daemon=True)
        proc.start()
        child.close()
        return proc, parent

    def run(self, cases: Sequence[Case]) -> Iterator[Result]:
        """Results in the order cases finish."""
        pending = list(reversed(cases))
        busy: dict[int, tuple[Case, float]] = {}
        size: dict[int, int] = {}  # the steps of each busy worker's input, once it has said
        while pending or busy:
            for i, (proc, conn) in enumerate(self.workers):
                if i not in busy and pending:
                    case = pending.pop()
                    conn.send(case)
                    busy[i] = (case, time.monotonic())
                    size.pop(i, None)
            conns = [self.workers[i][1] for i in busy]
            ready = multiprocessing.connection.wait(conns, timeout=0.5)
            for i in list(busy):
                proc, conn = self.workers[i]
                case, started = busy[i]
                if conn in ready:
                    try:
                        message = conn.recv()
                        if message[0] == "size":
                            size[i] = message[1]
                            busy[i] = (case, time.monotonic())  # the clock of the command itself
                            continue
                        outcome, detail, seconds, actions = message
                        actions = size.get(i, 0)
                    except (EOFError, OSError):
                        code = proc.exitcode if proc.exitcode is not None else proc.join(5) or proc.exitcode
                        outcome, detail, seconds, actions = "died", f"worker exit {code}", time.monotonic() - started, 0
                        self.workers[i] = self._start()
                    del busy[i]
                    yield Result(case, outcome, seconds, detail, actions)
                elif time.monotonic() - started > self.wall:
                    proc.kill()
                    proc.join(5)
                    self.workers[i] = self._start()
                    del busy[i]
                    steps = size.get(i, 0)
                    yield Result(case, "hang", time.monotonic() - started,
                                 f"killed after {self.wall:.0f} s, {steps} actions", steps)

    def close(self) -> None:
        for proc, conn in self.workers:
            with contextlib.suppress(OSError):
                conn.send(None)
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)


def cases(n: int, seed: int = 0) -> list[Case]:
    rng = random.Random(seed)
    seeds = seed_texts()
    return [make_case(rng, seeds, COMMANDS[i % len(COMMANDS)]) for i in range(n)]


if __name__ == "__main__":  # pragma: no cover - see scripts/fuzz.py
    sys.exit("run scripts/fuzz.py")
