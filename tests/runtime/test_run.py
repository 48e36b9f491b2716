"""`ppdsl run` with real processes on CPU (gloo over loopback). What is decided before any
process starts (plans, refusals, usage errors) is in test_plan_preflight.py, which needs no paddle.

Each paddle process costs about a second and 380 MB to start, so the correctness runs put many
schedule files in one launch (`ppdsl run a.pps b.pps ... --verify` runs them one after another
in the same processes). The fault tests each need a launch of their own, on 2 ranks.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from ppdsl.cli import main
from ppdsl.load import load_program

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
HAND = HERE / "schedules"
paddle = pytest.importorskip("paddle")

GENERATORS_2 = ["gpipe()", "1f1b()", "zb1p()", "zb2p()", "interleaved_1f1b(virtual=2)", "looped_bfs(virtual=2)",
                "zbv()", "v_half()", "v_min()", "dualpipev()"]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str, float]:
    t0 = time.monotonic()
    code = main(["run", *argv])
    out, err = capsys.readouterr()
    return code, out, err, time.monotonic() - t0


def _verified(out: str, files: list[str]) -> None:
    for f in files:
        assert re.search(rf"{re.escape(f)}: \d+ steps, .*verify ok", out), f"{f} not verified:\n{out}"


# --- correctness: every schedule against the unpipelined model ---------------------------

def test_verify_every_generator_and_hand_written_schedule_on_2_ranks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = []
    for call in GENERATORS_2:
        f = tmp_path / (call.split("(")[0] + ".pps")
        f.write_text(f"pipeline ranks=2 microbatches=4\nuse {call}\n")
        files.append(str(f))
    files += sorted(str(f) for f in HAND.glob("2r_*.pps") if "deadlock" not in f.name)
    code, out, err, _ = _run(capsys, *files, "--steps", "2", "--verify", "-q", "--timeout", "30")
    assert code == 0, err
    _verified(out, files)


def test_verify_every_shipped_schedule_on_4_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    files = sorted(str(f) for f in (ROOT / "schedules").glob("*.pps"))
    files += sorted(str(f) for f in HAND.glob("4r_*.pps"))
    assert any("dualpipev" in f for f in files) and any("interleaved" in f for f in files)
    code, out, err, _ = _run(capsys, *files, "--steps", "2", "--verify", "-q", "--timeout", "30")
    assert code == 0, err
    _verified(out, files)


def test_default_run_trains_prints_each_loss_and_profiles(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from ppdsl.costs import parse_profile

    f = str(HAND / "2r_1f1b_batched.pps")
    profile = tmp_path / "p.json"
    code, out, err, _ = _run(capsys, f, "--steps", "3", "--lr", "0.1", "--profile", str(profile))
    assert code == 0, err
    losses = [float(x) for x in re.findall(r"step \d/3  loss ([0-9.]+)", out)]
    assert len(losses) == 3 and all(x > 0 for x in losses)
    costs = parse_profile(profile.read_text())  # the simulator reads what the runtime wrote
    assert costs.unit == "us" and costs.get("F_s0") and costs.get("B_s1") and costs.get("comm")
    assert "simulated step" in out


def test_verify_catches_a_wrong_gradient(capsys: pytest.CaptureFixture[str]) -> None:
    # A relative tolerance of 0 on a float64 model still passes: the pipeline is exact...
    f = str(HAND / "2r_zb_iw.pps")
    code, out, err, _ = _run(capsys, f, "--steps", "1", "--verify", "--rtol", "0", "-q")
    assert code == 0, err
    # ...and a model whose stage differs between the two builds is caught by name.
    code, out, err, _ = _run(capsys, f, "--steps", "1", "--verify", "-q", "--model",
                             f"{HERE / 'drifting_model.py'}:build_stage")
    assert code == 1
    assert re.search(r"verify FAILED|gradient of stage\d\.", out + err)


# --- faults --------------------------------------------------------------------------------

def _fault(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, fault: str,
           *extra: str, timeout: str = "4") -> tuple[int, str, float]:
    monkeypatch.setenv("PPDSL_FAULT", fault)
    code, out, err, seconds = _run(capsys, str(HAND / "2r_1f1b_batched.pps"), "--steps", "3", "-q", "--timeout",
                                   timeout, "--model", f"{HERE / 'faulty_model.py'}:build_stage", *extra)
    return code, err, seconds


def test_exception_on_one_rank_stops_all_and_names_rank_step_action(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, err, seconds = _fault(capsys, monkeypatch, "raise:1:5")  # stage 1's 6th forward: step 1, 1F1
    assert code == 1
    assert "rank 1, step 1, action 1F1" in err and "boom in the model" in err
    assert seconds < 30


def test_killed_rank_is_named_and_never_leaves_the_other_hanging(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, err, seconds = _fault(capsys, monkeypatch, "kill:1:2")
    assert code == 1
    assert "rank 1 was killed by signal 9 at step 0, action 1F2" in err
    assert seconds < 30


def test_a_peer_that_never_answers_times_out(capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    t0 = time.monotonic()
    code, err, seconds = _fault(capsys, monkeypatch, "hang:1:1", timeout="3")
    assert code == 1
    assert re.search(r"rank 0: timed out after 3 s at step 0, action 0\S+ \(.*rank 1\)", err), err
    assert time.monotonic() - t0 < 30


def test_bad_model_and_loss_are_clear_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    f = str(HAND / "2r_zb_iw.pps")
    faulty = HERE / "faulty_model.py"
    code, out, err, _ = _run(capsys, f, "-q", "--model", f"{faulty}:not_a_layer")
    assert code == 1 and "returned dict, not a paddle.nn.Layer" in err and "Traceback" not in err
    code, out, err, _ = _run(capsys, f, "-q", "--model", f"{HERE / 'three_stage_model.py'}:build_stage")
    assert code == 1 and "NUM_STAGES=3" in err and "2 stages" in err
    code, out, err, _ = _run(capsys, f, "-q", "--loss", f"{faulty}:vector_loss")
    assert code == 1 and "must return a scalar" in err and "action 1F0" in err


def test_ranks_holding_different_programs_fail_together(tmp_path: Path) -> None:
    from ppdsl.runtime.launcher import launch

    a, b = str(HAND / "2r_zb_iw.pps"), str(HAND / "2r_1f1b_batched.pps")
    outcome = launch([load_program(a)], [a, b], steps=1, timeout=20, quiet=True, keep_logs=str(tmp_path),
                     command=[sys.executable, str(HERE / "api_mismatch.py")])
    assert outcome.code == 1
    for rank in (0, 1):
        lines = [json.loads(x) for x in (tmp_path / f"rank{rank}.log").read_text().splitlines() if x.startswith("{")]
        assert lines and "do not hold the same program" in lines[-1]["error"], lines


def test_the_example_training_loop_uses_the_api_directly(tmp_path: Path) -> None:
    from ppdsl.runtime.launcher import launch

    f = str(HAND / "2r_zb_iw.pps")
    outcome = launch([load_program(f)], [f, "8"], steps=0, timeout=30, quiet=True, keep_logs=str(tmp_path),
                     command=[sys.executable, str(ROOT / "examples" / "train_loop.py")])
    assert outcome.code == 0, outcome.failure
    losses = [float(x) for x in re.findall(r"step \d+: loss ([0-9.]+)", (tmp_path / "rank1.log").read_text())]
    assert len(losses) == 8 and losses[-1] < losses[0]
