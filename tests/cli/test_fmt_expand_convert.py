"""`ppdsl fmt`, `expand` and `convert` from the outside: output, files written, exit codes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from ppdsl.cli import main
from ppdsl.expansion import parse

GOOD = "pipeline ranks=2 microbatches=2\nrank 0: 0F{0..1} 0B{0..1}\nrank 1: 1F0 1B0 1F1 1B1\n"
UGLY = "pipeline  microbatches=2 ranks=2\nrank 0:  0F{ 0..1 }   0B{0..1}\nrank 1: 1F0 1B0 1F1 1B1\n"


def ppdsl(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The real command line in a fresh interpreter, as a user runs it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PPDSL_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "ppdsl", *args], cwd=cwd, env=env, input=stdin,
                          capture_output=True, text=True, timeout=60)


# ---- errors: file:line:col, the line, a caret, exit 1, no traceback -----------------------------

def test_bad_token_is_reported_with_line_and_caret(tmp_path: Path) -> None:
    (tmp_path / "bad.pps").write_text("pipeline ranks=2 microbatches=4\nrank 0: 0F0 0X3 0F1\n")
    r = ppdsl("expand", "bad.pps", cwd=tmp_path)
    assert r.returncode == 1 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert lines[0] == "bad.pps:2:13: error[PPS003]: unknown action kind `X` in `0X3`"
    assert lines[1] == "2 | rank 0: 0F0 0X3 0F1"
    assert lines[2] == " " * (len("2 | ") + 12) + "^^^"
    assert lines[3].startswith("  = help: ")
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("content, code", [
    (b"", "PPS010"),
    (b"\x7fELF\x02\x01\x01\x00\x00\x00garbage", "PPS000"),
    (b"pipeline ranks=2 microbatches=1000000\nrank 0: 0F{0..999999999}\n", "PPS014"),
    (b"\xef\xbb\xbfpipeline ranks=2 microbatches=4\r\nrank 0: 0F0 [0F1 0B0\r\n", "PPS006"),
])
def test_bad_files_exit_1_without_traceback(tmp_path: Path, content: bytes, code: str) -> None:
    (tmp_path / "x.pps").write_bytes(content)
    r = ppdsl("expand", "x.pps", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert f"error[{code}]" in r.stderr and r.stderr.startswith("x.pps:")
    assert "Traceback" not in r.stderr


def test_caret_under_the_column_after_a_bom_and_tabs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "t.pps").write_text("\ufeffpipeline\tranks=2 microbatches=4 colour=red\n", encoding="utf-8")
    assert main(["expand", str(tmp_path / "t.pps")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].endswith(":1:33: error[PPS012]: unknown header option `colour`")
    assert err[2].index("^") - len("1 | ") == err[1].index("colour") - len("1 | ")


def test_unreadable_path_exits_2(tmp_path: Path) -> None:
    r = ppdsl("fmt", "--check", "missing.pps", cwd=tmp_path)
    assert r.returncode == 2 and "missing.pps: no such file" in r.stderr and "Traceback" not in r.stderr
    r = ppdsl("expand", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and "is a directory" in r.stderr


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert", "a.pps", "-"]) == 2  # stdout needs --to
    assert main(["expand"]) == 2
    assert main(["fmt", "--no-such-flag", "x.pps"]) == 2
    assert main([]) == 2


# ---- fmt -------------------------------------------------------------------------------------

def test_fmt_rewrites_and_check_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ugly, good = tmp_path / "ugly.pps", tmp_path / "good.pps"
    ugly.write_text(UGLY)
    good.write_text(GOOD)
    assert main(["fmt", "--check", str(good)]) == 0
    assert main(["fmt", "--check", str(ugly), str(good)]) == 1
    assert ugly.read_text() == UGLY  # --check writes nothing
    assert "would reformat" in capsys.readouterr().err
    assert main(["fmt", "--diff", str(ugly)]) == 1
    assert "+rank 0: 0F{0..1} 0B{0..1}" in capsys.readouterr().out and ugly.read_text() == UGLY
    assert main(["fmt", str(ugly)]) == 0
    assert ugly.read_text() == GOOD
    assert main(["fmt", "--check", str(ugly)]) == 0


def test_fmt_goes_on_past_a_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.pps").write_text("pipeline ranks=1\n")
    (tmp_path / "b.pps").write_text(UGLY)
    assert main(["fmt", str(tmp_path / "a.pps"), str(tmp_path / "b.pps")]) == 1
    assert (tmp_path / "b.pps").read_text() == GOOD
    assert main(["fmt", str(tmp_path / "nope.pps"), str(tmp_path / "b.pps")]) == 2


def test_fmt_stdin_to_stdout(tmp_path: Path) -> None:
    r = ppdsl("fmt", "-", cwd=tmp_path, stdin=UGLY)
    assert r.returncode == 0 and r.stdout == GOOD


# ---- expand ----------------------------------------------------------------------------------

def test_expand_writes_every_action(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "g.pps"
    f.write_text("pipeline ranks=2 microbatches=3\nuse 1f1b()\n")
    assert main(["expand", str(f)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"# expanded from `use 1f1b()` in {f}\n")
    assert "rank 0: 0F0 0F1 0B0 0F2 0B1 0B2\n" in out and "{" not in out
    assert parse(out) == parse(f.read_text())
    assert main(["expand", str(f), "-o", str(tmp_path / "out.pps")]) == 0
    assert (tmp_path / "out.pps").read_text() == out


# ---- convert ---------------------------------------------------------------------------------

def test_convert_csv_to_pps_and_back(vectors: Path, tmp_path: Path) -> None:
    src = vectors / "zb1p_2rank_2stagep_comms.csv"
    r = ppdsl("convert", str(src), "s.pps", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    pps = (tmp_path / "s.pps").read_text()
    assert pps.startswith("# converted from ") and "2RECV_B0 2B0 2SEND_B0" in pps  # legacy BW -> B
    assert main(["convert", str(tmp_path / "s.pps"), str(tmp_path / "back.csv"), "--write-dialect", "legacy"]) == 0
    assert (tmp_path / "back.csv").read_text() == src.read_text()
    assert main(["convert", str(tmp_path / "s.pps"), "-", "--to", "csv"]) == 0


def test_convert_dialect_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "l.csv").write_text("0F0,0B0,0W0\n")
    assert main(["convert", str(tmp_path / "l.csv"), "-", "--to", "pps"]) == 0
    assert "rank 0: 0F0 0I0 0W0" in capsys.readouterr().out
    assert main(["convert", str(tmp_path / "l.csv"), "-", "--to", "pps", "--dialect", "current"]) == 0
    assert "rank 0: 0F0 0B0 0W0" in capsys.readouterr().out


def test_convert_warns_about_batches(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "b.pps").write_text("pipeline ranks=1 microbatches=1\nrank 0: 0F0 <0SEND_F0 0RECV_B0>\n")
    assert main(["convert", str(tmp_path / "b.pps"), str(tmp_path / "b.csv")]) == 0
    assert "warning[PPS031]" in capsys.readouterr().err
    assert (tmp_path / "b.csv").read_text() == "0F0,0SEND_F0,0RECV_B0\n"


def test_very_long_row_shows_a_window_around_the_caret(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    row = " ".join(f"0F{i % 4}" for i in range(20_000))
    (tmp_path / "long.pps").write_text(f"pipeline ranks=1 microbatches=4\nrank 0: {row} 0Q1 {row}\n")
    assert main(["expand", str(tmp_path / "long.pps")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].endswith(f":2:{9 + len(row) + 1}: error[PPS003]: unknown action kind `Q` in `0Q1`")
    assert len(err[1]) < 200 and err[1].startswith("2 | ...")
    caret = err[2].index("^")
    assert err[1][caret : caret + 3] == "0Q1" and err[2].count("^") == 3


def test_convert_says_one_cause_once_with_the_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Paddle's 1F1B on 2 ranks has six batches, which a CSV writes as separate cells: one cause.
    source = Path(__file__).resolve().parents[1] / "check" / "data" / "paddle_1f1b_2ranks.pps"
    assert main(["convert", str(source), str(tmp_path / "p.csv")]) == 0
    err = capsys.readouterr().err
    assert err.count("warning[PPS031]") == 1 and err.count("^") == 1
    assert f"{source}:5:26: warning[PPS031]: PyTorch's CSV has no batches: `<0SEND_F1 0RECV_B0>`" in err
    assert "  = note: and 5 more like it, at 5:54, 5:82, 6:26, 6:54, 6:82\n" in err


def test_fold_alike_keeps_causes_apart() -> None:
    from ppdsl.cli.common import FOLDED_PLACES, fold_alike
    from ppdsl.diagnostics import Diagnostic, Severity

    def warn(message: str, line: int) -> Diagnostic:
        return Diagnostic("PPS031", message, "a.pps", line, 1, severity=Severity.WARNING)

    alike = [warn(f"no batches: `<{n}>` split", n + 1) for n in range(FOLDED_PLACES + 3)]
    folded = fold_alike([*alike, warn("no place for the mode (`mode=inference`)", 1)])
    assert [d.message for d in folded] == ["no batches: `<0>` split", "no place for the mode (`mode=inference`)"]
    assert folded[0].notes == (f"and {FOLDED_PLACES + 2} more like it, at "
                               + ", ".join(f"{n}:1" for n in range(2, FOLDED_PLACES + 2)) + ", ...",)
    assert folded[1].notes == ()
