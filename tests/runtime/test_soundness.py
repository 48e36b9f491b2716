"""The checker's verdict against what real gloo does with the same program (issue 15).

Every case runs on real paddle processes over loopback, unguarded (`check=False,
_guard=False`: the bare transport) and, when it is clean or has PPS212, with the label guard
(and, with batches, through the runtime's NCCL code path for batches as well):
clean => completes with the unpipelined gradients exactly; PPS210 => hangs past its timeout;
PPS212 => completes with wrong gradients or fails on a shape, and the guard stops it with
both actions named. One launch per rank count runs all its cases (soundness.py).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

import ppdsl

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import soundness as S  # noqa: E402

ORDER = re.compile(r"rank (\d+), step 0, action (\S+): messages out of order on the link from rank (\d+): .*"
                   r"expects `(\S+)`, but message number \d+ that rank \3 sent on it is `(\S+)` "
                   r"\(rank \3, step 0, action \5\)")


def _rows(case: S.Case) -> list[set[str]]:
    program = ppdsl.parse(case.text)
    rows: list[set[str]] = [set() for _ in range(program.ranks)]
    for rank, _, action in program.actions():
        rows[rank].add(str(action))
    return rows


def test_the_cases_cover_the_issue() -> None:
    cases = S.cases()
    kinds = {c.kind for c in cases}
    mutations = [c for c in cases if c.kind not in ("base", "issue")]
    assert len(mutations) >= 20
    assert {"swapped receives", "swapped sends", "swapped members of a batch", "V-shape F/B on a shared link"} <= kinds
    verdicts = {c.name: S.verdict(ppdsl.parse(c.text)) for c in cases}
    assert verdicts["issue: swap under buffered"] == verdicts["issue: grouped batch swap"] == "PPS212"
    assert verdicts["both ranks send first"] == "PPS210"
    assert all(verdicts[c.name] == "clean" for c in cases if c.kind == "base")
    assert {"clean", "PPS212", "PPS210"} <= set(verdicts.values())
    assert "0SEND_F1 0SEND_F0" in S.ISSUE_BUFFERED_SWAP and "1RECV_F0 1RECV_F1" in S.ISSUE_BUFFERED_SWAP


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_checker_verdicts_match_real_gloo() -> None:
    pytest.importorskip("paddle")
    cases = S.cases()
    verdicts = {c.name: S.verdict(ppdsl.parse(c.text)) for c in cases}
    results = S.run(cases, verdicts)
    # Every mode agrees with the checker, the runtime's NCCL batch path (its group calls posted
    # together over gloo: sends on the sending threads) guarded and unguarded as well.
    assert not S.disagreements(results, verdicts), S.table(results, verdicts)
    by = {(r.case.name, r.mode): r for r in results}
    # docs/runtime.md's V-placement batch, which once waited forever on the NCCL path.
    v_batch = "V placement: a batch sends and receives a new activation"
    assert {by[(v_batch, m)].outcome for m in S.MODES if (v_batch, m) in by} == {"exact"}, S.table(results, verdicts)
    assert sum(r.mode == S.UNGUARDED_BATCH for r in results) >= 5
    assert by[("issue: swap under buffered", S.UNGUARDED)].outcome == "wrong"
    assert by[("issue: grouped batch swap", S.UNGUARDED)].outcome == "wrong"
    assert by[("issue: grouped batch swap", S.BATCH_PATH)].outcome == "stopped"
    assert by[("both ranks send first", S.UNGUARDED)].outcome == "hung"
    # With sends in the background the same program completes, exactly: the runtime's own transport.
    assert by[("both ranks send first", S.UNGUARDED_BACKGROUND)].outcome == "exact"
    assert sum(r.mode == S.BACKGROUND and r.outcome == "exact" for r in results) >= 15
    assert any(r.mode == S.BACKGROUND and r.outcome == "stopped" for r in results)
    # The guard names both ends: the receive on one rank, the send that arrived from the other.
    for r in results:
        if r.outcome != "stopped":
            continue
        m = ORDER.search(r.detail)
        assert m, r.detail
        receiver, recv, sender, want, got = int(m[1]), m[2], int(m[3]), m[4], m[5]
        rows = _rows(r.case)
        assert recv in rows[receiver] and got in rows[sender] and want in rows[sender] and want != got
    # docs/runtime.md shows the guard's message for that example: the real one.
    shown = S.docs_block("runtime.md", "text", "## Without the checker").strip()
    assert by[("issue: swap under buffered", S.GUARDED)].detail == shown


@pytest.mark.slow
def test_a_crash_after_other_cases_is_judged_again_in_fresh_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A case that kills its processes, run after another in the same launch, runs again first
    in a new one (a thread an earlier case left in gloo could have been the cause), and only
    then counts as crashed; the cases around it keep their own outcomes."""
    pytest.importorskip("paddle")
    import attrs

    from ppdsl.runtime.jobs import launcher

    by_name = {c.name: c for c in S.cases()}
    clean = by_name["1f1b 2r"]
    crash = attrs.evolve(clean, name="crash", abort=True)  # rank 1 aborts (SIGABRT) as the case starts
    jobs = [(attrs.evolve(clean, name="before"), S.UNGUARDED), (crash, S.UNGUARDED),
            (attrs.evolve(clean, name="after"), S.UNGUARDED)]
    firsts: list[bool] = []  # per launch: does it start with the case that aborts
    real_launch = launcher.launch

    def counted(*args: object, **kwargs: object) -> launcher.Outcome:
        spec = json.loads(Path(str(args[1][0])).read_text())  # type: ignore[index]
        firsts.append(bool(spec["cases"][0]["abort"]))
        return real_launch(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(launcher, "launch", counted)
    results = S._run_launches(jobs, S.HANG_SECONDS)
    assert [r.outcome for r in results] == ["exact", "crashed", "exact"], [(r.outcome, r.detail) for r in results]
    assert "signal" in results[1].detail
    # The relaunch with the crash first; once more when rank 0's start of it never reached the
    # launcher before the abort (a loaded machine): that launch counts as one that never began.
    assert firsts in ([False, True, False], [False, True, True, False]), firsts


@pytest.mark.slow
def test_the_guard_under_the_launcher_stops_every_rank_at_once(tmp_path: Path) -> None:
    pytest.importorskip("paddle")
    import time

    from ppdsl.runtime.jobs.launcher import launch

    f = tmp_path / "swap.pps"
    f.write_text(S.ISSUE_BUFFERED_SWAP)
    t0 = time.monotonic()
    outcome = launch([ppdsl.parse(S.ISSUE_BUFFERED_SWAP)], [str(f)], steps=1, timeout=60, quiet=True,
                     command=[sys.executable, str(HERE / "helpers" / "api_unchecked.py")])
    seconds = time.monotonic() - t0
    assert outcome.code == 1 and outcome.failure is not None
    assert ORDER.search(outcome.failure), outcome.failure
    assert any(e.get("kind") == "MessageOrderError" and e["rank"] == 1 for e in outcome.events)
    assert seconds < 45  # rank 0, blocked sending, was stopped, not left to its 60 s timeout


@pytest.mark.slow
def test_ranks_must_agree_on_the_guard(tmp_path: Path) -> None:
    pytest.importorskip("paddle")
    from ppdsl.load import load_program
    from ppdsl.runtime.jobs.launcher import launch

    f = str(HERE / "schedules" / "2r_zb_iw.pps")
    outcome = launch([load_program(f)], ["--guard-mix", f], steps=1, timeout=20, quiet=True, keep_logs=str(tmp_path),
                     command=[sys.executable, str(HERE / "helpers" / "api_mismatch.py")])
    assert outcome.code == 1
    for rank in (0, 1):
        lines = [json.loads(x) for x in (tmp_path / f"rank{rank}.log").read_text().splitlines() if x.startswith("{")]
        assert lines and "ranks 1 run without the label guard" in lines[-1]["error"], lines


def test_a_label_reads_back_from_its_note_and_a_garbled_one_is_refused() -> None:
    from ppdsl.ir import Kind
    from ppdsl.runtime.errors import PeerError
    from ppdsl.runtime.transport.messages import Label, decode_note, encode_note

    label = Label(Kind.SEND_B, 2, 1, 3)
    assert Label.read(decode_note(encode_note(label))["label"], 4, 2) == label and label.action == "2SEND_B1"
    for bad in ([int(Kind.RECV_F), 0, 0, 1], [int(Kind.SEND_F), 4, 0, 1], [int(Kind.SEND_F), 0, 2, 1],
                [int(Kind.SEND_F), 0, 0, 0], [1, 2, 3], None, [0.5, 0, 0, 1]):
        with pytest.raises(PeerError, match="garbled message label"):
            Label.read(bad, 4, 2)
    for garbage in (b"\xff\xfe", b"[1, 2]", b"{"):
        with pytest.raises(PeerError, match="garbled note"):
            decode_note(garbage)
