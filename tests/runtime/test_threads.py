"""How many intra-op threads local ranks get, and the warning when they want more cores than
there are. Nothing here starts a rank: the warning is said before any does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ppdsl.cli import main
from ppdsl.runtime.jobs.launcher import cores, oversubscription, threads_per_rank

ROOT = Path(__file__).resolve().parents[2]


def test_ranks_that_fit_get_no_warning() -> None:
    assert oversubscription(2, 1, available=2) is None
    assert oversubscription(4, 1, available=2) is None  # one thread a rank: nothing to lower
    assert oversubscription(4, 4, available=16) is None


def test_too_many_threads_say_the_cores_and_a_count_that_fits() -> None:
    assert oversubscription(2, 4, available=4) == (
        "2 ranks x 4 threads = 8 threads on 4 cores: they compete for the cores and every step slows; "
        "--threads 2 fits")


def test_more_ranks_than_cores_say_that_no_thread_count_fits() -> None:
    warning = oversubscription(4, 2, available=2)
    assert warning is not None and warning.startswith("4 ranks x 2 threads = 8 threads on 2 cores")
    assert warning.endswith("even --threads 1 puts 4 ranks on 2 cores: fewer ranks or more cores")
    assert oversubscription(1, 2, available=1) == (
        "1 rank x 2 threads = 2 threads on 1 core: they compete for the cores and every step slows; --threads 1 fits")


def test_the_runtime_md_warning_is_the_one_printed() -> None:
    page = (ROOT / "docs" / "runtime.md").read_text(encoding="utf-8")
    shown = re.search(r"^ppdsl run: warning: (\d+ ranks x .*)$", page, re.M)
    assert shown is not None and shown.group(1) == oversubscription(2, 2, available=2)


def test_one_rank_is_one_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    threads, why = threads_per_rank(1)
    assert threads == cores() and why.endswith(" / 1 rank") and why.startswith(f"{cores()} core")


def test_run_warns_before_it_starts_a_rank(capsys: pytest.CaptureFixture[str]) -> None:
    # A --model of the wrong form stops the run after the checks and before any process.
    threads = cores() + 1
    assert main(["run", str(ROOT / "schedules" / "1f1b.pps"), "--threads", str(threads), "--model", "::"]) == 2
    err = capsys.readouterr().err
    assert f"ppdsl run: warning: 4 ranks x {threads} threads = {4 * threads} threads on " in err
    assert err.index("warning") < err.index("error: --model")


def test_a_one_rank_program_says_one_rank() -> None:
    from ppdsl.diagnostics import UsageError
    from ppdsl.runtime.interpreter.plan import compile_rank
    from ppdsl.expansion import parse

    program = parse("pipeline ranks=1 microbatches=1\nrank 0: 0F0 0B0\n", "one.pps")
    with pytest.raises(UsageError, match=r"^rank 1 is outside this program's 1 rank$"):
        compile_rank(program, 1)


def test_threads_per_rank_fits_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    import ppdsl.runtime.jobs.launcher as launcher

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(launcher, "cores", lambda: 8)
    assert threads_per_rank(2) == (4, "8 cores / 2 ranks")
    assert threads_per_rank(3)[0] == 2 and threads_per_rank(16)[0] == 1  # never 0
    assert threads_per_rank(2, 3) == (3, "--threads")
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert threads_per_rank(2) == (5, "OMP_NUM_THREADS")
