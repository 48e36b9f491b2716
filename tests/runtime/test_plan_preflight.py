"""What `ppdsl run` decides before any process starts: each rank's plan, and the refusal of a
file that would hang on the backend. None of it needs paddle, so none of it skips without it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from soundness import ISSUE_BUFFERED_SWAP as OUT_OF_ORDER

import ppdsl
from ppdsl.cli import main
from ppdsl.diagnostics import PpsError, UsageError
from ppdsl.encoding import encode
from ppdsl.load import load_program
from ppdsl.runtime.interpreter import plan as P
from ppdsl.runtime.interpreter.preflight import deadlock, prepare
from ppdsl.semantics import CommModel

HERE = Path(__file__).parent
HAND = HERE / "schedules"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str, float]:
    t0 = time.monotonic()
    code = main(["run", *argv])
    out, err = capsys.readouterr()
    return code, out, err, time.monotonic() - t0


def test_plan_names_peers_pairs_and_labels() -> None:
    program = load_program(str(HAND / "2r_v_overlap.pps"))
    plan = P.compile_rank(program, 0)
    assert plan.local_stages == (0, 3) and plan.pairs == ((0, 1),)
    sends = [op for op in plan.ops if op.kind == P.SEND_F]
    assert [(op.label, op.peer) for op in sends] == [("0SEND_F0", 1), ("0SEND_F1", 1)]
    overlap = next(op for op in plan.ops if op.kind == P.OVERLAP)
    assert [p.kind for p in overlap.parts] == [P.F, P.B]  # forward first
    assert P.compile_rank(program, 1).digest == plan.digest


def test_plan_refuses_send_between_stages_of_one_rank(tmp_path: Path) -> None:
    f = tmp_path / "bad.pps"
    f.write_text("pipeline ranks=2 microbatches=1 stages=4 placement=v\n"
                 "rank 0: 0F0 0SEND_F0 3RECV_F0 3F0 3B0 3SEND_B0 0RECV_B0 0B0\n"
                 "rank 1: 1RECV_F0 1F0 1SEND_F0 2RECV_F0 2F0 2SEND_F0 2RECV_B0 2B0 2SEND_B0 1RECV_B0 1B0 1SEND_B0\n")
    with pytest.raises(UsageError, match=r"error\[PPS204\]: `1SEND_F0` hands data between stages 1 and 2, both on rank 1"):
        P.compile_rank(load_program(str(f)), 1)


def test_gloo_refuses_paddles_1f1b_order_nccl_accepts_it() -> None:
    program = load_program(str(HAND / "2r_deadlock.pps"))
    why = deadlock(program, CommModel.RENDEZVOUS)
    assert why is not None and "0SEND_F1" in why and "1SEND_B0" in why
    assert deadlock(program, CommModel.GROUPED) is None
    with pytest.raises(PpsError, match="PPS2"):  # the checker's wait-for cycle
        prepare(program, CommModel.RENDEZVOUS)
    assert prepare(program, CommModel.GROUPED) == program


def test_run_refuses_a_file_that_would_hang_on_gloo(capsys: pytest.CaptureFixture[str]) -> None:
    # Both ranks send first: a hang only when each send waits for its receive.
    code, out, err, seconds = _run(capsys, str(HAND / "2r_deadlock.pps"), "--blocking-sends")
    assert code == 1
    assert "0SEND_F1" in err and "1SEND_B0" in err and "rendezvous" in err
    assert seconds < 5  # refused before any process starts
    # A receive before the send it depends on hangs with sends in the background too.
    code, out, err, seconds = _run(capsys, str(HAND / "2r_receive_first.pps"))
    assert code == 1
    assert "PPS210" in err and "buffered" in err and "0RECV_B0" in err
    assert seconds < 5


def test_run_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    # Spelling errors are caught before paddle or the user's module is imported.
    code, _, err, _ = _run(capsys, str(HAND / "2r_zb_iw.pps"), "--model", "nosuch.py:")
    assert code == 2 and "expected MODULE:NAME" in err
    code, _, err, _ = _run(capsys, str(HAND / "2r_zb_iw.pps"), "--optimizer", "rmsprop")
    assert code == 2 and "choose one of sgd, momentum, adam, adamw" in err
    code, _, err, _ = _run(capsys, str(HAND / "2r_zb_iw.pps"), str(HAND / "4r_fthenb.pps"))
    assert code == 2 and "same number of ranks" in err


def test_the_checker_refuses_an_out_of_order_link_under_every_backend() -> None:
    for model in (CommModel.RENDEZVOUS, CommModel.GROUPED):
        with pytest.raises(PpsError) as info:
            prepare(ppdsl.parse(OUT_OF_ORDER), model)
        assert [d.code for d in info.value.diagnostics] == ["PPS212"]


def test_check_false_runs_the_program_as_written() -> None:
    program = ppdsl.parse(OUT_OF_ORDER)
    assert prepare(program, CommModel.RENDEZVOUS, check=False) == program
    deadlock = load_program(str(HAND / "2r_deadlock.pps"))
    assert prepare(deadlock, CommModel.RENDEZVOUS, check=False) == deadlock  # its PPS210 is not raised either


def test_check_false_still_lowers_a_compute_only_program() -> None:
    program = ppdsl.parse("pipeline ranks=2 microbatches=2\nuse gpipe()\n")
    lowered = prepare(program, CommModel.RENDEZVOUS, check=False)
    assert not encode(program).has_comms and encode(lowered).has_comms
    assert lowered == prepare(program, CommModel.RENDEZVOUS)


@pytest.mark.slow
def test_these_tests_pass_where_paddle_cannot_be_imported(tmp_path: Path) -> None:
    # `sys.modules[name] = None` is how Python marks a module absent: `import paddle` fails.
    code = ("import sys; sys.modules['paddle'] = None; import pytest; "
            f"sys.exit(pytest.main([{str(Path(__file__))!r}, '-q', '-p', 'no:cacheprovider', "
            "'-k', 'not cannot_be_imported']))")
    env = {**os.environ, "PYTHONPATH": str(HERE.parents[1])}
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    this = "test_these_tests_pass_where_paddle_cannot_be_imported"
    others = [name for name in globals() if name.startswith("test_") and name != this]  # none parametrized
    assert f"{len(others)} passed" in r.stdout and "skipped" not in r.stdout


def test_a_prepared_program_is_prepared_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    from ppdsl.runtime.interpreter import preflight

    program = ppdsl.parse("pipeline ranks=2 microbatches=2\nuse 1f1b()\n")
    calls: list[str] = []
    real = preflight.lint
    monkeypatch.setattr(preflight, "lint", lambda p, model: calls.append(str(model)) or real(p, model))
    ready = preflight.prepare(program, CommModel.BUFFERED)
    linted = len(calls)
    assert linted >= 1
    assert preflight.prepare(ready, CommModel.BUFFERED) is ready and len(calls) == linted
    preflight.prepare(ready, CommModel.RENDEZVOUS)  # another model: linted under it
    assert calls[linted:] == ["rendezvous"]


def test_the_digest_tells_programs_apart_without_printing_them() -> None:
    def digest(text: str) -> str:
        return P.program_digest(ppdsl.parse("pipeline ranks=2 microbatches=2\n" + text))

    base = digest("rank 0: 0F0 0F1 0B0 0B1\nrank 1: 1F0 1F1 1B0 1B1\n")
    assert base == digest("rank 0: 0F{0..1} 0B{0..1}\nrank 1: 1F0 1F1 1B0 1B1\n")  # the same actions
    for other in ("rank 0: 0F0 0F1 0B1 0B0\nrank 1: 1F0 1F1 1B0 1B1\n",  # an order
                  "rank 0: 0F0 _ 0F1 0B0 0B1\nrank 1: 1F0 1F1 1B0 1B1\n",  # an idle step
                  "rank 0: 0F0 0F1 0B0 0B1\nrank 1: 1F0 (1F1;1B0) 1B1\n"):  # an overlapped pair
        assert digest(other) != base, other
