"""Two-line files of a quarter and of a million steps: every command reads the first by
default, the second with the `--max-steps` its message gives (their times are in
benchmarks/bench_big_files.py, not asserted here)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from ppdsl.cli import main

QUARTER = "pipeline ranks=64 microbatches=1024\nuse interleaved_1f1b(virtual=2)\n"  # 262,144 steps
MILLION = "pipeline ranks=128 microbatches=2048\nuse interleaved_1f1b(virtual=2)\n"  # 1,048,576 steps


def timed(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    start = time.perf_counter()
    code = main(list(argv))
    out, err = capsys.readouterr()
    with capsys.disabled():  # seen with -s; benchmarks/bench_big_files.py keeps the figures
        print(f"ppdsl {argv[0]}: {time.perf_counter() - start:.2f} s")
    return code, out, err


def _file(tmp_path: Path, text: str) -> str:
    f = tmp_path / "big.pps"
    f.write_text(text)
    return str(f)


def lint_and_simulate(capsys: pytest.CaptureFixture[str], f: str, ranks: int, makespan: float, *flags: str) -> None:
    code, out, err = timed(capsys, "lint", f, *flags)
    assert (code, out, err) == (0, "", "")
    code, out, err = timed(capsys, "simulate", f, "--format", "json", *flags)
    assert code == 0, err
    data = json.loads(out)
    assert (data["ranks"], data["makespan"]) == (ranks, makespan)


def test_a_quarter_million_steps_lint_simulate_and_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = _file(tmp_path, QUARTER)
    lint_and_simulate(capsys, f, 64, 3166.5)
    code, out, err = timed(capsys, "show", f, "--no-color")
    assert code == 0, err
    assert len(out.splitlines()) <= 50 and "ranks 45-63 not shown" in out


@pytest.mark.slow
def test_a_million_steps_lint_and_simulate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = _file(tmp_path, MILLION)
    code, out, _ = timed(capsys, "lint", f)
    assert code == 1 and "`interleaved_1f1b` makes 1,048,576 steps, more than the limit of 500,000" in out
    assert "`--max-steps 1048576` takes them" in out
    lint_and_simulate(capsys, f, 128, 6334.5, "--max-steps", "1048576")
    # Past show's default, with the count and the flag that takes it.
    code, out, err = timed(capsys, "show", f)
    assert code == 1 and "`interleaved_1f1b` makes 1,048,576 steps, more than the limit of 262,144" in err
    assert "`--max-steps 1048576` takes them" in err
