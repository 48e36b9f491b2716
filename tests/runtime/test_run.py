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
from procs import SPLIT_WARNING, generator_files

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


def _memory_as_predicted(out: str, files: list[str], ranks: int) -> None:
    """Each rank's measured peak of live graphs (one per stage and microbatch) is the checker's, file by file."""
    for f in files:
        found = re.findall(rf"{re.escape(f)}: rank (\d+): peak (\d+) live graphs, one per stage and microbatch "
                           r"\(checker predicts (\d+)\)", out)
        assert sorted(int(r) for r, _, _ in found) == list(range(ranks)), f"{f}: no memory lines:\n{out}"
        assert all(a == b for _, a, b in found), f"{f}: measured != predicted: {found}"


# --- correctness: every schedule against the unpipelined model ---------------------------

@pytest.mark.slow
def test_verify_every_generator_and_hand_written_schedule_on_2_ranks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = generator_files(tmp_path, GENERATORS_2)
    # With sends in the background (the default on gloo) Paddle's own Schedule1F1B order
    # (2r_deadlock.pps: both ranks send first) runs too.
    files += sorted(str(f) for f in HAND.glob("2r_*.pps") if "receive_first" not in f.name)
    files.append(str(ROOT / "tests" / "check" / "data" / "paddle_1f1b_2ranks.pps"))  # the README's
    code, out, err, _ = _run(capsys, *files, "--steps", "2", "--verify", "-q", "--timeout", "30",
                             "--profile", str(tmp_path / "p.json"))
    assert code == 0, err
    _verified(out, files)
    _memory_as_predicted(out, files, 2)


@pytest.mark.slow
def test_blocking_sends_verify(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    zb1p = tmp_path / "zb1p.pps"
    zb1p.write_text("pipeline ranks=2 microbatches=4\nuse zb1p()\n")
    files = [str(zb1p), str(HAND / "2r_v_overlap.pps")]
    code, out, err, _ = _run(capsys, *files, "--steps", "2", "--verify", "-q", "--blocking-sends")
    assert code == 0, err
    _verified(out, files)


@pytest.mark.slow
def test_verify_every_shipped_schedule_on_4_ranks(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from ppdsl.generators.registry import ALIASES, REGISTRY

    files = sorted(str(f) for f in (ROOT / "schedules").glob("*.pps"))
    files += sorted(str(f) for f in HAND.glob("4r_*.pps"))
    used = {ALIASES.get(m.group(1), m.group(1)) for f in files
            for m in re.finditer(r"^use (\w+)\(", Path(f).read_text(), re.M)}
    assert used == set(REGISTRY), "every generator runs at 4 ranks"
    code, out, err, _ = _run(capsys, *files, "--steps", "2", "--verify", "-q", "--timeout", "30",
                             "--profile", str(tmp_path / "p.json"))
    assert code == 0, err
    _verified(out, files)
    _memory_as_predicted(out, files, 4)


# A split W adds its product inside the GEMM (ppdsl/runtime/paddle_backend/blas.py), which rounds otherwise
# than autograd's matmul + add: float64 gradients then agree to ~1e-15, not bit for bit.
FUSED_RTOL = "1e-12"


@pytest.mark.slow
def test_clipping_by_the_global_norm_verifies_with_replicas(capsys: pytest.CaptureFixture[str]) -> None:
    # A limit far below the model's gradient norm clips every step; --verify clips the
    # unpipelined model the same way and compares the norms, the losses and the weights after.
    files = [str(ROOT / "schedules" / "zbv.pps")]
    code, out, err, _ = _run(capsys, *files, "--steps", "3", "--verify", "-q", "--clip-grad-norm", "0.01",
                             "--dp", "2")
    assert code == 0, err
    _verified(out, files)


@pytest.mark.slow
def test_a_non_finite_step_is_skipped_on_every_rank(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    data = str(HERE / "helpers" / "nonfinite_data.py") + ":batches"  # its second batch holds an infinity
    base = [str(ROOT / "schedules" / "1f1b.pps"), "--framework", "torch", "--data", data, "--steps", "4"]
    code, out, err, _ = _run(capsys, *base, "--skip-nonfinite", "--verify")
    assert code == 0, err
    lines = [line for line in out.splitlines() if line.startswith("step ")]
    assert [("skipped" in line) for line in lines] == [False, True, False, False], out
    assert "nan" not in out and "verify ok" in out
    code, out, err, _ = _run(capsys, *base)  # without it, the step's gradients reach the weights
    assert "step 3/4  loss nan" in out, out


@pytest.mark.slow
def test_split_backward_opt_out_is_exact(capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(HAND / "2r_zb_iw.pps"), str(HAND / "2r_v_overlap.pps")]
    code, out, err, _ = _run(capsys, *files, "--steps", "2", "--verify", "--rtol", "0", "-q", "--no-split-backward")
    assert code == 0, err
    _verified(out, files)
    assert "warning" not in err


@pytest.mark.slow
def test_a_linear_the_split_cannot_defer_warns_once_and_verifies(capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(HAND / "2r_zb_iw.pps"), str(HAND / "2r_v_overlap.pps")]
    code, out, err, _ = _run(capsys, *files, "--steps", "2", "--verify", "--rtol", FUSED_RTOL, "-q", "--model",
                             f"{HERE / 'helpers' / 'scaled_linear_model.py'}:build_stage")
    assert code == 0, err
    _verified(out, files)
    warnings = re.findall(r"ppdsl run: warning: .*", err)
    assert warnings == [SPLIT_WARNING]


@pytest.mark.slow
def test_default_run_trains_prints_each_loss_and_profiles(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from ppdsl.profiles import parse_profile
    from ppdsl.runtime.jobs.launcher import cores

    f = tmp_path / "zb1p.pps"  # compute-only: the runtime lowers it, and so must the simulation
    f.write_text("pipeline ranks=2 microbatches=4\nuse zb1p()\n")
    profile = tmp_path / "p.json"
    code, out, err, _ = _run(capsys, str(f), "--steps", "3", "--lr", "0.1", "--profile", str(profile))
    assert code == 0, err
    threads = max(1, cores() // 2)
    assert f"(gloo, local processes, {threads} thread" in out  # the thread choice, printed once
    losses = [float(x) for x in re.findall(r"step \d/3  loss ([0-9.]+)", out)]
    assert len(losses) == 3 and all(x > 0 for x in losses)
    costs = parse_profile(profile.read_text())  # the simulator reads what the runtime wrote
    assert costs.unit == "us" and costs.get("F_s0") and costs.get("I_s1") and costs.get("W_s1") and costs.get("comm")
    said = re.search(r"--comm-model buffered: makespan ([0-9.]+) us vs measured step (\d+) us", out)
    assert said, out
    # One number for "simulated step": `ppdsl simulate` on the same file, profile and model (sends
    # in the background: buffered) prints it.
    assert main(["simulate", str(f), "--costs", str(profile), "--comm-model", "buffered"]) == 0
    sim_out = capsys.readouterr().out
    assert "lowered to explicit send/recv" in sim_out
    assert f"\nmakespan: {said.group(1)}\n" in sim_out


@pytest.mark.slow
def test_verify_catches_a_wrong_gradient(capsys: pytest.CaptureFixture[str]) -> None:
    # A float64 model passes at float64's rounding: the pipeline computes the same sums...
    f = str(HAND / "2r_zb_iw.pps")
    code, out, err, _ = _run(capsys, f, "--steps", "1", "--verify", "--rtol", FUSED_RTOL, "-q")
    assert code == 0, err
    # ...and a model whose stage differs between the two builds is caught by name.
    code, out, err, _ = _run(capsys, f, "--steps", "1", "--verify", "-q", "--model",
                             f"{HERE / 'helpers' / 'drifting_model.py'}:build_stage")
    assert code == 1
    assert re.search(r"verify FAILED|gradient of stage\d\.", out + err)


# --- faults --------------------------------------------------------------------------------

def _fault(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, fault: str,
           *extra: str, timeout: str = "4") -> tuple[int, str, float]:
    monkeypatch.setenv("PPDSL_FAULT", fault)
    code, out, err, seconds = _run(capsys, str(HAND / "2r_1f1b_batched.pps"), "--steps", "3", "-q", "--timeout",
                                   timeout, "--model", f"{HERE / 'helpers' / 'faulty_model.py'}:build_stage", *extra)
    return code, err, seconds


@pytest.mark.slow
def test_exception_on_one_rank_stops_all_and_names_rank_step_action(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, err, seconds = _fault(capsys, monkeypatch, "raise:1:5")  # stage 1's 6th forward: step 1, 1F1
    assert code == 1
    assert "rank 1, step 1, action 1F1" in err and "boom in the model" in err
    assert seconds < 30


@pytest.mark.slow
def test_killed_rank_is_named_and_never_leaves_the_other_hanging(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    code, err, seconds = _fault(capsys, monkeypatch, "kill:1:2")
    assert code == 1
    assert "rank 1 was killed by signal 9 at step 0, action 1F2" in err
    assert seconds < 30


def test_a_rank_that_crashes_in_native_code_leaves_its_python_stacks(tmp_path: Path) -> None:
    from ppdsl.runtime.jobs.launcher import launch

    # A rank that is not Paddle's (whose import puts its own handler first): Python's
    # faulthandler, which the launcher turns on, writes every thread's stack to the rank's log.
    script = tmp_path / "crash.py"
    script.write_text("import os, signal, sys\n"
                      "def deep_in_the_model():\n"
                      "    if os.environ['RANK'] == '1':\n"
                      "        os.kill(os.getpid(), signal.SIGSEGV)\n"
                      "deep_in_the_model()\n")
    f = str(HAND / "2r_zb_iw.pps")
    outcome = launch([load_program(f)], [f], steps=0, timeout=30, quiet=True, keep_logs=str(tmp_path),
                     command=[sys.executable, str(script)])
    assert outcome.code == 1 and "rank 1 was killed by signal 11" in str(outcome.failure), outcome.failure
    log = (tmp_path / "rank1.log").read_text()
    assert "Fatal Python error: Segmentation fault" in log and "in deep_in_the_model" in log, log


@pytest.mark.slow
def test_a_peer_that_never_answers_times_out(capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    t0 = time.monotonic()
    code, err, seconds = _fault(capsys, monkeypatch, "hang:1:1", timeout="3")
    assert code == 1
    assert re.search(r"rank 0: timed out after 3 s at step 0, action 0\S+ \(.*rank 1\)", err), err
    assert time.monotonic() - t0 < 30


@pytest.mark.slow
def test_bad_model_and_loss_are_clear_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    f = str(HAND / "2r_zb_iw.pps")
    faulty = HERE / "helpers" / "faulty_model.py"
    code, out, err, _ = _run(capsys, f, "-q", "--model", f"{faulty}:not_a_layer")
    assert code == 1 and "returned dict, not a paddle.nn.Layer" in err and "Traceback" not in err
    code, out, err, _ = _run(capsys, f, "-q", "--model", f"{HERE / 'helpers' / 'three_stage_model.py'}:build_stage")
    assert code == 2 and "NUM_STAGES=3" in err and "2 stages" in err  # refused before spawning
    code, out, err, _ = _run(capsys, f, "-q", "--loss", f"{faulty}:vector_loss")
    assert code == 1 and "must return a scalar" in err and "action 1F0" in err


@pytest.mark.slow
def test_ranks_holding_different_programs_fail_together(tmp_path: Path) -> None:
    from ppdsl.runtime.jobs.launcher import launch

    a, b = str(HAND / "2r_zb_iw.pps"), str(HAND / "2r_1f1b_batched.pps")
    outcome = launch([load_program(a)], [a, b], steps=1, timeout=20, quiet=True, keep_logs=str(tmp_path),
                     command=[sys.executable, str(HERE / "helpers" / "api_mismatch.py")])
    assert outcome.code == 1
    for rank in (0, 1):
        lines = [json.loads(x) for x in (tmp_path / f"rank{rank}.log").read_text().splitlines() if x.startswith("{")]
        assert lines and "do not hold the same program" in lines[-1]["error"], lines


@pytest.mark.slow
def test_the_example_training_loop_uses_the_api_directly(tmp_path: Path) -> None:
    from ppdsl.runtime.jobs.launcher import launch

    f = str(HAND / "2r_zb_iw.pps")
    outcome = launch([load_program(f)], [f, "8"], steps=0, timeout=30, quiet=True, keep_logs=str(tmp_path),
                     command=[sys.executable, str(ROOT / "examples" / "train_loop.py")])
    assert outcome.code == 0, outcome.failure
    log = (tmp_path / "rank1.log").read_text()
    losses = [float(x) for x in re.findall(r"step \d+: loss ([0-9.]+)", log)]
    assert len(losses) == 8 and losses[-1] < losses[0]
    held_out = re.findall(r"eval: loss ([0-9.]+) on (\d+) samples", log)  # forwards only, every rank
    assert len(held_out) == 1 and held_out[0][1] == "64" and float(held_out[0][0]) < losses[0], log


# --- checked before any process starts ----------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["--model", "nosuch.mod:fn"], "cannot import `nosuch.mod`"),
    (["--model", "examples/my_model.py:"], "expected MODULE:NAME"),
    (["--data", "examples/my_model.py:nope"], "has no `nope`"),
    (["--optimizer", "rmsprop"], "choose one of sgd, momentum, adam, adamw"),
    (["--model", "examples/gpt/corpus.txt"], "examples/gpt/corpus.txt: not a Python file (`.py`); give a .py file or "
                                             "an importable module that defines `build_stage`"),
    (["--model", "examples/"], "examples/: is a folder with no model.py in it; give a .py file"),
    (["--data", "examples/gpt/corpus.txt:batches"], "not a Python file (`.py`); give MODULE:NAME"),
])
def test_bad_arguments_exit_2_before_spawning(argv: list[str], message: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err, seconds = _run(capsys, str(HAND / "2r_zb_iw.pps"), *argv)
    assert code == 2 and message in err, err
    assert "rank" not in err and seconds < 8  # no worker ever started (it takes longer to join)


@pytest.mark.slow
def test_one_rank_and_inference_programs_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one = tmp_path / "one.pps"
    one.write_text("pipeline ranks=1 microbatches=2\nrank 0: 0F0 0F1 0B0 0B1\n")
    inference = tmp_path / "inference.pps"
    inference.write_text("pipeline ranks=2 microbatches=2 mode=inference\nuse gpipe()\n")
    code, out, err, _ = _run(capsys, str(one), "--steps", "2", "--verify", "-q")
    assert code == 0 and re.search(r"one.pps: 2 steps, loss .* verify ok", out), out + err
    code, out, err, _ = _run(capsys, str(inference), "--steps", "3", "-q")
    assert code == 0 and "inference.pps: 3 steps" in out, out + err


# --- what a new user met -------------------------------------------------------------------

def test_a_batch_that_does_not_split_is_refused_before_any_rank_starts(capsys: pytest.CaptureFixture[str]) -> None:
    # The GPT example named by its folder; its batches hold 16 rows, DualPipeV has 10 microbatches.
    code, _, err, seconds = _run(capsys, str(ROOT / "schedules" / "dualpipev.pps"), "-q",
                                 "--model", str(ROOT / "examples" / "gpt"))
    assert code == 2, err
    assert "a batch of 16 cannot be split into the 10 microbatches" in err and "1, 2, 4, 8, 16 microbatches" in err
    assert "ccache" not in err and "Traceback" not in err
    assert seconds < 30


@pytest.mark.slow
def test_a_users_model_does_not_choose_the_threads(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # Importing paddle (the model does) sets OMP_NUM_THREADS in the launching process.
    from ppdsl.runtime.jobs.launcher import cores

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    f = tmp_path / "1f1b.pps"
    f.write_text("pipeline ranks=2 microbatches=4\nuse 1f1b()\n")
    code, out, err, _ = _run(capsys, str(f), "--steps", "1", "--model", str(ROOT / "examples" / "my_model.py"))
    assert code == 0, err
    assert f"each: {cores()} cores / 2 ranks)" in out, out


@pytest.mark.slow
def test_targets_missing_on_one_rank_stop_every_rank_with_its_reason(tmp_path: Path) -> None:
    """Real Paddle processes on gloo: the last stage's rank forgets the targets on the first
    step; the other rank is told why through the first step's notes, in seconds."""
    from ppdsl.runtime.jobs.launcher import launch

    f = tmp_path / "two.pps"
    f.write_text("pipeline ranks=2 microbatches=4\nuse 1f1b()\n")
    outcome = launch([load_program(str(f))], [], steps=0, timeout=60, quiet=True, keep_logs=str(tmp_path),
                     command=[sys.executable, str(HERE / "helpers" / "missing_target.py")])
    assert outcome.code == 0, outcome.failure
    reason = "the last stage needs the batch's targets: step(inputs, target=...)"
    told = [re.search(r"told after ([0-9.]+) s: (.*)", (tmp_path / f"rank{r}.log").read_text()) for r in (0, 1)]
    assert all(told), [(tmp_path / f"rank{r}.log").read_text() for r in (0, 1)]
    assert told[1] and told[1].group(2) == f"SetupError: {reason}"
    assert told[0] and told[0].group(2).startswith("StepError: rank 0, step 0") and \
        f"rank 1 stopped before step 0: {reason}" in told[0].group(2)
    assert float(told[0].group(1)) < 20
