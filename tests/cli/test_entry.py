"""The installed command's exit (`ppdsl.cli.entry`): a command done on return ends the process at
once, and loses nothing for it: every byte written, the exit code kept, a closed pipe quiet."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from conftest import ROOT

from ppdsl.cli import DONE_ON_RETURN, main

# Buffered streams, as most users have them (this environment may set PYTHONUNBUFFERED).
ENV = {**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}, "PYTHONPATH": str(ROOT)}
BIG = "pipeline ranks=8 microbatches=2048\nuse 1f1b()\n"  # ~200 kB printed: more than a pipe holds


def _ppdsl(tmp_path: Path, *argv: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ppdsl", *argv], cwd=tmp_path, env=ENV, capture_output=True,
                          text=True, timeout=120, **kw)  # type: ignore[call-overload, no-any-return]


@pytest.mark.parametrize("text", [BIG, "pipeline ranks=2 microbatches=2\nuse 1f1b()\n"], ids=["big", "small"])
def test_stdout_is_whole_and_the_code_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    # The small one stays in the stream's buffer until the exit flushes it.
    (tmp_path / "a.pps").write_text(text)
    monkeypatch.chdir(tmp_path)
    shown = io.StringIO()
    with redirect_stdout(shown):
        assert main(["expand", "a.pps"]) == 0
    r = _ppdsl(tmp_path, "expand", "a.pps")
    assert r.returncode == 0 and "Traceback" not in r.stderr
    assert r.stdout == shown.getvalue() and len(r.stdout) > len(text)


@pytest.mark.slow
def test_a_file_written_with_o_is_whole(tmp_path: Path) -> None:
    (tmp_path / "big.pps").write_text(BIG)
    r = _ppdsl(tmp_path, "expand", "big.pps", "--comms", "-o", "out.pps")
    assert r.returncode == 0, r.stderr
    again = _ppdsl(tmp_path, "lint", "out.pps")
    assert again.returncode == 0, again.stdout
    assert not list(tmp_path.glob(".*ppdsl-tmp"))


def test_problems_still_exit_1_with_every_diagnostic(tmp_path: Path) -> None:
    (tmp_path / "bad.pps").write_text("pipeline ranks=2 microbatches=2\nrank 0: 0F0 0F1 0B1\nrank 1: 1F0 1F1 1B0 1B1\n")
    r = _ppdsl(tmp_path, "lint", "bad.pps")
    assert r.returncode == 1
    assert "PPS1" in r.stdout and r.stdout.rstrip().splitlines()[-1].strip()


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path: Path) -> None:
    (tmp_path / "big.pps").write_text(BIG)
    proc = subprocess.Popen([sys.executable, "-m", "ppdsl", "expand", "big.pps"], cwd=tmp_path, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(10)
    proc.stdout.close()  # as `| head -c 10` does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_commands_that_start_processes_exit_as_usual() -> None:
    assert not {"run", "search"} & DONE_ON_RETURN


@pytest.mark.slow
@pytest.mark.parametrize("closed", ["stdout", "stderr", "both"])
def test_a_closed_stream_changes_no_exit_code(tmp_path: Path, closed: str) -> None:
    # A process started with descriptor 1 or 2 closed (`>&-`, some daemons) has sys.stdout or
    # sys.stderr None: nothing to flush, and the code is the command's.
    (tmp_path / "a.pps").write_text("pipeline ranks=2 microbatches=2\nuse 1f1b()\n")
    (tmp_path / "bad.pps").write_text("pipeline ranks=2 microbatches=2\nrank 0: 0F0\nrank 1: 1F0\n")
    close = {"stdout": ">&-", "stderr": "2>&-", "both": ">&- 2>&-"}[closed]
    for name, code in (("a.pps", 0), ("bad.pps", 1)):
        r = subprocess.run(f"{sys.executable} -m ppdsl lint {name} {close}", shell=True, cwd=tmp_path, env=ENV,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == code, (name, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr + r.stdout


def test_usage_and_help_through_the_command(tmp_path: Path) -> None:
    assert _ppdsl(tmp_path, "lint", "--help").returncode == 0
    bad = _ppdsl(tmp_path, "lint", "--no-such-option", "a.pps")
    assert bad.returncode == 2 and "unrecognized arguments" in bad.stderr
    missing = _ppdsl(tmp_path, "lint", "missing.pps")
    assert missing.returncode == 2 and "missing.pps" in missing.stderr
