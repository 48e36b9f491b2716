"""The soundness cases (programs, mutations) and the driver that runs them on real gloo.

No paddle here: the cases are programs, the driver starts `soundness_worker.py` ranks with
the runtime's launcher and reads what they report. Used by `test_soundness.py` and by
`scripts/soundness_table.py` (which prints the verdict-vs-outcome table).

A case is run unguarded (`PipelineSchedule(check=False, _guard=False)`: what the bare
transport does) and, where the guard has something to say, guarded, through the gloo path and
(for batches) the runtime's NCCL path, which gloo runs member by member (a clean program with
batches runs that path unguarded too). Its verdict is what
`ppdsl lint` says under `rendezvous`, gloo's model.
"""

from __future__ import annotations

import functools
import json
import random
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import attrs
from attrs import define, field, frozen

import ppdsl
from ppdsl.check import check
from ppdsl.ir import Action, Batch, Kind, Program, Step
from ppdsl.lower import lower
from ppdsl.runtime.interpreter.plan import peer_of
from ppdsl.encoding import RECV_F, SEND_F, encode

from ppdsl.encoding import KIND_MASK

HERE = Path(__file__).resolve().parent
WORKER = HERE / "soundness_worker.py"
# Seconds every rank still running a case must have sat in one send or receive before the case
# counts as hung (soundness_worker: a slow rank on a busy machine is not a hung one). The
# programs are a few milliseconds of work; a hang is a send or receive that never meets its peer.
# 3 s was seen passed by a send and its receive that did meet, on two cores running two suites
# side by side (gloo's transfer threads not scheduled): 6 s, at a few hung cases' cost.
HANG_SECONDS = 6.0
COMM_CODES = frozenset({"PPS210", "PPS211", "PPS212"})
PARALLEL_LAUNCHES = 4  # at most this many sets of worker processes at once (2 cores here)


@frozen
class Case:
    name: str
    kind: str  # how it was made: base, issue, swapped receives, swapped sends, ...
    text: str
    ranks: int
    abort: bool = False  # rank 1 aborts as the case starts (the harness's own test of a crash)


# --- programs ----------------------------------------------------------------------------

def _generated(call: str, ranks: int, microbatches: int, fuse: bool) -> Program:
    return lower(ppdsl.parse(f"pipeline ranks={ranks} microbatches={microbatches}\nuse {call}\n"), fuse=fuse)


def _receive_first_gpipe(ranks: int, microbatches: int, batched: bool) -> Program:
    """GPipe where each rank receives all its inputs before computing: many receives from one
    peer side by side (as batches when `batched`), so swapping two is an order change only."""
    M, lines = range(microbatches), []
    for r in range(ranks):
        def group(kind: str, s: int = r) -> list[str]:
            toks = [f"{s}{kind}{m}" for m in M]
            return [f"<{' '.join(toks)}>"] if batched else toks
        row: list[str] = []
        if r > 0:
            row += group("RECV_F")
        row += [f"{r}F{m}" for m in M]
        if r < ranks - 1:
            row += group("SEND_F") + group("RECV_B")
        row += [f"{r}B{m}" for m in M]
        if r > 0:
            row += group("SEND_B")
        lines.append(f"rank {r}: " + " ".join(row))
    return ppdsl.parse(f"pipeline ranks={ranks} microbatches={microbatches}\n" + "\n".join(lines) + "\n")


def docs_block(page: str, fence: str, after: str) -> str:
    """The first ```fence block after the heading `after` of docs/`page`."""
    text = (HERE.parents[2] / "docs" / page).read_text(encoding="utf-8")
    return re.findall(rf"^```{fence}\n(.*?)^```", text[text.index(after):], flags=re.S | re.M)[0]


# The issue's first example, as docs/comm-models.md explains it: rank 0 sends microbatch 1
# first, rank 1 receives microbatch 0 first (accepted under `buffered` before PPS212).
ISSUE_BUFFERED_SWAP = docs_block("comm-models.md", "pps", "## Messages match in order")
ISSUE_GROUPED_SWAP = """pipeline ranks=2 microbatches=2
rank 0: 0F0 0F1 <0SEND_F1 0SEND_F0> 0RECV_B0 0B0 0RECV_B1 0B1
rank 1: <1RECV_F0 1RECV_F1> 1F0 1B0 1SEND_B0 1F1 1B1 1SEND_B1
"""
# docs/runtime.md's V-placement batch on NCCL: rank 0's `<0SEND_F1 3RECV_F0>` receives stage 2's
# first activation, which rank 1 computes only once it has 0SEND_F1's data. Clean on every model.
V_BATCH = """pipeline ranks=2 microbatches=2 placement=v
rank 0: 0F0 0SEND_F0 0F1 <0SEND_F1 3RECV_F0> 3F0 3B0 3RECV_F1 3SEND_B0 3F1 3B1 0RECV_B0 3SEND_B1 0B0 0RECV_B1 0B1
rank 1: 1RECV_F0 1F0 1RECV_F1 2F0 2SEND_F0 1F1 2F1 2SEND_F1 2RECV_B0 2B0 1B0 1SEND_B0 2RECV_B1 2B1 1B1 1SEND_B1
"""
BOTH_SEND_FIRST = """pipeline ranks=2 microbatches=2
rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1
rank 1: 1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1
"""


def bases() -> list[tuple[str, Program]]:
    """Clean programs: generated and lowered (plain and fused), and hand-made ones."""
    out: list[tuple[str, Program]] = []
    for call in ("gpipe()", "1f1b()", "zbv()", "v_half()", "interleaved_1f1b(virtual=2)"):
        for fuse in (False, True):
            out.append((f"{call.split('(')[0]} 2r{' fused' if fuse else ''}", _generated(call, 2, 3, fuse)))
    out.append(("1f1b 3r", _generated("1f1b()", 3, 3, False)))
    out.append(("receive-first gpipe 2r", _receive_first_gpipe(2, 3, False)))
    out.append(("receive-first gpipe 2r batched", _receive_first_gpipe(2, 3, True)))
    out.append(("receive-first gpipe 3r", _receive_first_gpipe(3, 2, False)))
    return out


# --- mutations ---------------------------------------------------------------------------

def _peer(a: Action, program: Program) -> int:
    return peer_of(a, program.placement)


def _plain_comms(program: Program, rank: int, send: bool) -> list[tuple[int, Action]]:
    return [(i, s) for i, s in enumerate(program.rows[rank])
            if isinstance(s, Action) and s.kind.is_comm and s.kind.is_send == send]


def _with_row(program: Program, rank: int, row: list[Step]) -> Program:
    rows = list(program.rows)
    rows[rank] = tuple(row)
    # Through the text: the mutant is parsed exactly as a user's file would be.
    return ppdsl.parse(ppdsl.print_program(attrs.evolve(program, rows=tuple(rows))))


def mutants(program: Program) -> Iterator[tuple[str, Program]]:
    """Every swap of two messages that are next to each other on one link.

    A receive is moved to just before the one before it on its link, a send to just after
    the one after it (so compute still precedes its send and follows its receive); a batch
    has two of its members on one link exchanged, or all its members reversed."""
    for rank, row in enumerate(program.rows):
        for send in (False, True):
            comms = _plain_comms(program, rank, send)
            for (i, a), (j, b) in zip(comms, comms[1:]):
                if _peer(a, program) != _peer(b, program):
                    continue
                new = list(row)
                if send:  # A goes to just after B
                    new.insert(j, new.pop(i))
                elif b.kind is Kind.RECV_B and Action(b.stage, Kind.F, b.microbatch) in row[i:j]:
                    continue  # the runtime sizes a gradient's buffer from its forward's output
                else:     # B goes to just before A
                    new.insert(i, new.pop(j))
                kind = "V-shape F/B on a shared link" if a.kind != b.kind else \
                    ("swapped sends" if send else "swapped receives")
                yield kind, _with_row(program, rank, new)
        for i, step in enumerate(row):
            if not isinstance(step, Batch) or len(step.parts) < 2:
                continue
            parts = list(step.parts)
            for x in range(len(parts) - 1):
                a, b = parts[x], parts[x + 1]
                if a.kind.is_send == b.kind.is_send and _peer(a, program) == _peer(b, program):
                    swapped = parts[:x] + [b, a] + parts[x + 2:]
                    yield "swapped members of a batch", _with_row(program, rank, _replace(row, i, swapped))
            yield "reversed batch", _with_row(program, rank, _replace(row, i, parts[::-1]))


def _replace(row: tuple[Step, ...], i: int, parts: list[Action]) -> list[Step]:
    new = list(row)
    new[i] = Batch(tuple(parts))
    return new


def verdict(program: Program, model: str = "rendezvous") -> str:
    """'clean', or the checker's communication error codes joined (e.g. 'PPS212')."""
    codes = sorted({d.code for d in check(program, comm_model=model) if d.is_error})
    return "+".join(codes) if codes else "clean"


def _only_comm_errors(program: Program) -> bool:
    """Keep mutants whose every problem is about communication order (no compute moved
    before its input): those are the ones the runtime can be asked about."""
    codes = {d.code for d in check(program, comm_model="rendezvous") if d.is_error}
    return codes <= COMM_CODES


# How many mutants of each kind the suite runs (chosen by a fixed seed among all of them), and
# how many of them may hang: each hang costs HANG_SECONDS, the rest milliseconds.
MAX_HANGING = 1
PER_KIND = {"swapped receives": 8, "swapped sends": 8, "swapped members of a batch": 5,
            "V-shape F/B on a shared link": 6, "reversed batch": 4}


def cases() -> list[Case]:
    """The issue's examples, every base program, and a fixed sample of their mutants."""
    out = [Case("issue: swap under buffered", "issue", ISSUE_BUFFERED_SWAP, 2),
           Case("issue: grouped batch swap", "issue", ISSUE_GROUPED_SWAP, 2),
           Case("both ranks send first", "issue", BOTH_SEND_FIRST, 2),
           Case("V placement: a batch sends and receives a new activation", "issue", V_BATCH, 2)]
    seen = {ppdsl.print_program(ppdsl.parse(c.text)) for c in out}
    by_kind: dict[str, list[Case]] = {}
    for name, base in bases():
        text = ppdsl.print_program(base)
        seen.add(text)
        out.append(Case(name, "base", text, base.ranks))
        for n, (kind, m) in enumerate(mutants(base)):
            t = ppdsl.print_program(m)
            if t in seen or not _only_comm_errors(m):
                continue
            seen.add(t)
            by_kind.setdefault(kind, []).append(Case(f"{name} #{n}", kind, t, m.ranks))
    rng = random.Random(15)
    for kind, cap in PER_KIND.items():
        pool = by_kind.get(kind, [])
        rng.shuffle(pool)
        taken = hanging = 0
        for c in pool:
            if taken == cap:
                break
            if "PPS210" in verdict(ppdsl.parse(c.text)):
                if hanging == MAX_HANGING:
                    continue
                hanging += 1
            out.append(c)
            taken += 1
    return out


# --- running them ------------------------------------------------------------------------

UNGUARDED, GUARDED, BATCH_PATH = "unguarded", "guarded", "guarded, NCCL batch path"
UNGUARDED_BATCH = "unguarded, NCCL batch path"
# gloo with sends in the background (the runtime's default): judged under `buffered`.
BACKGROUND, UNGUARDED_BACKGROUND = "guarded, sends in the background", "unguarded, sends in the background"
MODES = (UNGUARDED, GUARDED, BATCH_PATH, UNGUARDED_BATCH, BACKGROUND, UNGUARDED_BACKGROUND)
NCCL_PATH = (BATCH_PATH, UNGUARDED_BATCH)
BACKGROUND_MODES = (BACKGROUND, UNGUARDED_BACKGROUND)


def guarded(mode: str) -> bool:
    return mode in (GUARDED, BATCH_PATH, BACKGROUND)


@functools.lru_cache(maxsize=None)
def _buffered_verdict(text: str) -> str:
    return verdict(ppdsl.parse(text), "buffered")


def mode_verdict(case: Case, mode: str, verdicts: dict[str, str]) -> str:
    """What the checker says of a case under the model of the transport that mode runs:
    `buffered` with sends in the background, `rendezvous` (`verdicts`) otherwise."""
    return _buffered_verdict(case.text) if mode in BACKGROUND_MODES else verdicts[case.name]


@define
class Result:
    """What happened to one case in one mode."""

    case: Case
    mode: str  # one of MODES
    outcome: str = "not run"  # exact | wrong | failed | stopped | hung | crashed
    detail: str = ""
    ranks: list[str] = field(factory=list)  # each rank's own status
    seconds: list[float] = field(factory=list)  # rank 0: set-up, the step, the comparison


def run(selected: Sequence[Case], verdicts: dict[str, str] | None = None,
        hang_seconds: float = HANG_SECONDS) -> list[Result]:
    """Run every case unguarded, and guarded too when it is clean or has PPS212 (a pure
    deadlock hangs with or without labels: the guard has nothing to say there).

    One launch of worker processes per rank count runs all of that count's cases in turn
    (the two launches at once); a launch whose ranks die is restarted on the cases left
    (`_run_launches`)."""
    verdicts = verdicts if verdicts is not None else {c.name: verdict(ppdsl.parse(c.text)) for c in selected}
    jobs: list[tuple[Case, str]] = []
    for c in selected:
        jobs.append((c, UNGUARDED))
        if verdicts[c.name] == "clean" or "PPS212" in verdicts[c.name]:
            jobs.append((c, GUARDED))
        if verdicts[c.name] in ("clean", "PPS212") and "<" in c.text:
            jobs.append((c, BATCH_PATH))
        if verdicts[c.name] == "clean" and "<" in c.text:  # the bare NCCL path: it must complete
            jobs.append((c, UNGUARDED_BATCH))
        # With sends in the background: every case buffered calls clean must complete exactly,
        # guarded (and bare where rendezvous would hang), and the guard must stop swapped sends.
        buffered = _buffered_verdict(c.text)
        if buffered == "clean" or (buffered == "PPS212" and c.kind == "swapped sends"):
            jobs.append((c, BACKGROUND))
        if buffered == "clean" and verdicts[c.name] != "clean":
            jobs.append((c, UNGUARDED_BACKGROUND))
    # One launch per rank count; a run that will likely kill its processes (gloo aborts on a
    # message larger than the buffer posted for it) gets a launch of its own, side by side,
    # rather than costing the shared launch a restart.
    launches: dict[object, list[tuple[Case, str]]] = {}
    for job in jobs:
        alone = job[1] == UNGUARDED and crosses_kinds(ppdsl.parse(job[0].text))
        launches.setdefault(job if alone else job[0].ranks, []).append(job)
    with ThreadPoolExecutor(PARALLEL_LAUNCHES) as pool:
        parts = list(pool.map(lambda js: _run_launches(js, hang_seconds), launches.values()))
    results = {(r.case.name, r.mode): r for part in parts for r in part}
    return [results[(c.name, g)] for c, g in jobs]


def crosses_kinds(program: Program) -> bool:
    """Some receive gets a message of the other kind (an activation for a gradient): unguarded,
    its data can meet a buffer of another size, and gloo aborts the process on the size. Read
    off the one matching rule (`links.Links`: k-th receive on a link, k-th send)."""
    for sent, got in encode(program).links.order.values():
        for s, r in zip(sent, got):
            if (s & KIND_MASK == SEND_F) != (r & KIND_MASK == RECV_F):
                return True
    return False


def _run_launches(jobs: list[tuple[Case, str]], hang_seconds: float) -> list[Result]:
    """Run `jobs` in one launch of worker processes, and again on the cases left when the ranks die.

    A crash is a case's outcome only when that case ran first in fresh processes: after other
    cases, a thread one of them left blocked in gloo (a hung or stopped case) shares the
    process, so the case runs again at the head of a new launch. A launch that dies before
    any case starts is retried once; then its first case is reported crashed, with the reason."""
    from ppdsl.runtime.jobs.launcher import launch

    results = [Result(c, g) for c, g in jobs]
    todo = list(range(len(jobs)))
    failed_starts = 0
    while todo:
        with tempfile.TemporaryDirectory(prefix="ppdsl-soundness-") as tmp:
            spec = Path(tmp) / "cases.json"
            spec.write_text(json.dumps({"hang_seconds": hang_seconds, "dir": tmp,
                                        "cases": [{"text": jobs[i][0].text, "guarded": guarded(jobs[i][1]),
                                                   "backend": "nccl" if jobs[i][1] in NCCL_PATH else "gloo",
                                                   "background": jobs[i][1] in BACKGROUND_MODES,
                                                   "abort": jobs[i][0].abort}
                                                  for i in todo]}))
            program = ppdsl.parse(jobs[todo[0]][0].text)
            logs = Path(tmp) / "logs"
            outcome = launch([program], [str(spec)], steps=0, timeout=30, quiet=True, keep_logs=str(logs),
                             command=[sys.executable, str(WORKER)])
            tails = _log_tails(logs) if outcome.code != 0 else ""
        started: list[int] = []
        for e in outcome.events:
            if e.get("event") == "case_start" and e.get("rank") == 0:
                started.append(todo[int(e["index"])])
            elif e.get("event") == "case" and e.get("rank") == 0:
                r = results[todo[int(e["index"])]]
                r.outcome, r.detail, r.ranks = str(e["outcome"]), str(e.get("detail", "")), list(e.get("ranks", []))
                r.seconds = [float(x) for x in e.get("seconds", [])]
        done = {i for i in todo if results[i].outcome != "not run"}
        left = [i for i in todo if i not in done]
        if left and outcome.code != 0:
            in_progress = next((i for i in started if i in left), None)
            if in_progress is None and started:
                pass  # died between two cases: neither one's outcome; the rest run again
            elif in_progress is None and failed_starts == 0:
                failed_starts += 1  # no case began: the launch itself failed; once more
            elif in_progress is None or in_progress == todo[0]:
                crashed = left[0] if in_progress is None else in_progress
                results[crashed].outcome = "crashed"
                results[crashed].detail = (outcome.failure or "the worker processes died") + tails
                left.remove(crashed)
            else:
                left.remove(in_progress)
                left.insert(0, in_progress)
        elif left:  # pragma: no cover - the worker exits early only by dying
            for i in left:
                results[i].outcome, results[i].detail = "crashed", "the workers stopped early"
            left = []
        todo = left
    return results


def _log_tails(logs: Path, lines: int = 3) -> str:
    """The last lines each rank wrote (gloo's reason for an abort is there), for a crash's detail."""
    out = []
    for log in sorted(logs.glob("rank*.log")):
        text = [x for x in log.read_text(errors="replace").splitlines() if x and not x.startswith("{")]
        if text:
            out.append(f"{log.stem}: " + " | ".join(text[-lines:]))
    return (" [" + "; ".join(out) + "]") if out else ""


def expected(verdict_: str, guarded: bool) -> set[str]:
    """The outcomes consistent with a verdict: what soundness means, case by case.

    clean: completes with exactly the unpipelined gradients. PPS212 alone: nothing hangs,
    the data lands in the wrong place (wrong gradients, or a transfer or a process fails on
    a shape); guarded, the first mismatched receive stops the run. PPS210/PPS211: it hangs;
    with PPS212 as well, a rank may first fail on a mismatched message, or (guarded) be
    stopped by it, but nothing completes."""
    codes = set(verdict_.split("+"))
    if verdict_ == "clean":
        return {"exact"}
    if codes == {"PPS212"}:
        return {"stopped"} if guarded else {"wrong", "failed", "crashed"}
    if codes <= {"PPS210", "PPS211"}:
        return {"hung"}
    if codes <= {"PPS210", "PPS211", "PPS212"}:
        return {"hung", "stopped"} if guarded else {"hung", "failed", "crashed"}
    return {"exact", "wrong", "failed", "crashed", "stopped", "hung"}  # other verdicts: reported only


def table(results: Sequence[Result], verdicts: dict[str, str]) -> str:
    """Markdown: verdict x outcome counts, then one line per case that disagrees."""
    counts: dict[tuple[str, str, str], int] = {}
    for r in results:
        key = (mode_verdict(r.case, r.mode, verdicts), r.mode, r.outcome)
        counts[key] = counts.get(key, 0) + 1
    outcomes = ["exact", "wrong", "failed", "crashed", "hung", "stopped"]
    lines = ["| checker (rendezvous; buffered for sends in the background) | run | " + " | ".join(outcomes) + " | agrees |",
             "| --- | --- | " + " | ".join("---" for _ in outcomes) + " | --- |"]
    for v, m in sorted({(k[0], k[1]) for k in counts}, key=lambda k: (k[0] != "clean", k[0], MODES.index(k[1]))):
        row = [str(counts.get((v, m, o), 0)) for o in outcomes]
        agree = sum(counts.get((v, m, o), 0) for o in expected(v, guarded(m)))
        total = sum(counts.get((v, m, o), 0) for o in outcomes)
        lines.append(f"| {v} | {m} | " + " | ".join(row) + f" | {agree}/{total} |")
    for r in disagreements(results, verdicts):
        lines.append(f"\nDISAGREES: {r.case.name} ({r.case.kind}, {r.mode}): checker says "
                     f"{mode_verdict(r.case, r.mode, verdicts)}, the run {r.outcome}: {r.detail[:300]}")
    return "\n".join(lines)


def disagreements(results: Sequence[Result], verdicts: dict[str, str]) -> list[Result]:
    return [r for r in results if r.outcome not in expected(mode_verdict(r.case, r.mode, verdicts), guarded(r.mode))]


def kinds_table(results: Sequence[Result], verdicts: dict[str, str]) -> str:
    """How many cases of each kind, and their verdicts."""
    per: dict[str, dict[str, int]] = {}
    for r in results:
        if r.mode == UNGUARDED:
            d = per.setdefault(r.case.kind, {})
            d[verdicts[r.case.name]] = d.get(verdicts[r.case.name], 0) + 1
    lines = ["| kind | cases | verdicts |", "| --- | --- | --- |"]
    for kind, d in per.items():
        lines.append(f"| {kind} | {sum(d.values())} | " + ", ".join(f"{v} x{n}" for v, n in sorted(d.items())) + " |")
    return "\n".join(lines)
