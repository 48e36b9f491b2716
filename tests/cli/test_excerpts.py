"""The source excerpt under a diagnostic: no raw control bytes reach the terminal, the caret sits
under what is shown (tabs, wide characters, escapes), and standard input gets an excerpt too."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from conftest import ROOT
from ppdsl.cli import main
from ppdsl.diagnostics import Diagnostic, render_text

HEADER = "pipeline ranks=2 microbatches=2\n"


def _lint(tmp_path: Path, data: bytes, capsys: pytest.CaptureFixture[str]) -> list[str]:
    path = tmp_path / "x.pps"
    path.write_bytes(data)
    assert main(["lint", str(path)]) == 1
    out = capsys.readouterr().out
    for ch in out:
        assert ch in "\n" or ch.isprintable(), f"raw {ch!r} printed"
    return out.splitlines()


def _caret_under(lines: list[str], shown: str) -> None:
    """The caret line's carets start under `shown` on the excerpt line."""
    excerpt, caret = lines[1], lines[2]
    assert caret.strip().startswith("^")
    assert excerpt[caret.index("^"):].startswith(shown), (excerpt, caret)


def test_a_nul_byte_is_shown_as_an_escape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = _lint(tmp_path, b"pipe\0line ranks=2 microbatches=2\n", capsys)
    assert lines[0].endswith(":1:5: error[PPS000]: binary data, not a UTF-8 text file")
    assert lines[1] == "1 | pipe\\x00line ranks=2 microbatches=2"
    assert lines[2] == "        ^^^^"


def test_a_terminal_escape_sequence_is_not_sent_to_the_terminal(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    lines = _lint(tmp_path, HEADER.encode() + b"rank 0: 0F0 0X\x1b[31m0\n", capsys)
    assert "\\x1b" in lines[1] and "\\x1b" in lines[0]
    _caret_under(lines, "0X\\x1b")


def test_a_bidirectional_override_is_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = _lint(tmp_path, (HEADER + "rank 0: 0F0 \u202e0B0\n").encode(), capsys)
    _caret_under(lines, "\\u202e")


def test_the_caret_counts_a_tab_as_the_blank_it_is_shown_as(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    lines = _lint(tmp_path, (HEADER + "rank 0:\t0F0\t\t0X0\n").encode(), capsys)
    assert lines[1] == "2 | rank 0: 0F0  0X0"
    _caret_under(lines, "0X0")


def test_the_caret_counts_wide_characters_as_two_cells(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = _lint(tmp_path, (HEADER + "rank 0: 0F0 日本 0X0\n").encode(), capsys)
    assert lines[1] == "2 | rank 0: 0F0 日本 0X0"
    assert lines[2] == " " * len("2 | rank 0: 0F0 ") + "^^^^"  # two wide characters: four cells


def test_a_form_feed_does_not_shift_the_excerpt_to_another_line(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    # Only `\n` ends a line for the parser; str.splitlines() would also break at \x0c.
    lines = _lint(tmp_path, (HEADER + "# a\x0cb\nrank 0: 0F0 0X0\n").encode(), capsys)
    assert lines[0].endswith(":3:13: error[PPS003]: unknown action kind `X` in `0X0`")
    assert lines[1] == "3 | rank 0: 0F0 0X0"


def test_a_long_line_is_cut_around_the_caret() -> None:
    line = "rank 0: " + "日" * 200 + " 0X0 " + "0F0 " * 100
    column = line.index("0X0") + 1
    text = render_text(Diagnostic("PPS003", "m", "x.pps", 2, column, column + 3), line).splitlines()
    assert text[1].startswith("2 | ...") and text[1].endswith("...")
    before = text[1][: text[1].index(" 0X0 ") + 1]
    cells = sum(2 if unicodedata.east_asian_width(ch) == "W" else 1 for ch in before)
    assert text[2] == " " * cells + "^^^"


def test_utf16_gets_its_own_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = _lint(tmp_path, (HEADER + "rank 0: 0X0\n").encode("utf-16"), capsys)
    assert lines[0].endswith(":1:1: error[PPS000]: UTF-16 text, not UTF-8")
    assert lines[-1] == ("  = help: save the file as UTF-8 (PowerShell's `>` writes UTF-16; "
                         "`iconv -f UTF-16 -t UTF-8` converts it)")


def test_language_md_shows_the_utf16_message_as_printed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = _lint(tmp_path, (HEADER + "rank 0: 0X0\n").encode("utf-16"), capsys)
    page = (ROOT / "docs" / "language.md").read_text(encoding="utf-8")
    assert f"x.pps:1:1: {lines[0].split(': ', 1)[1]}\n{lines[-1]}\n" in page


def test_standard_input_gets_an_excerpt(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO((HEADER + "rank 0: 0F0 0X0\n").encode())))
    assert main(["lint", "-"]) == 1
    assert capsys.readouterr().out.splitlines()[:3] == [
        "-:2:13: error[PPS003]: unknown action kind `X` in `0X0`", "2 | rank 0: 0F0 0X0", " " * 16 + "^^^"]


def test_standard_input_of_a_real_process_gets_an_excerpt(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "ppdsl", "lint", "-"], input=HEADER + "rank 0: 0F0 0X0\n",
                       capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert r.returncode == 1
    assert r.stdout.splitlines()[1:3] == ["2 | rank 0: 0F0 0X0", " " * 16 + "^^^"]


def test_an_excerpt_of_a_huge_row_costs_what_a_short_one_does() -> None:
    import time

    line = "rank 0: " + "0F0 " * 500_000 + "0X0"
    column = len(line) - 2
    t0 = time.process_time()  # CPU time: a shared machine's load must not fail it
    for _ in range(50):
        text = render_text(Diagnostic("PPS003", "m", "x.pps", 2, column, column + 3), line).splitlines()
    assert time.process_time() - t0 < 1.0  # 50 diagnostics; looking at every character takes seconds
    assert text[1].startswith("2 | ...") and text[1].endswith("0X0") and text[2].endswith("^^^")
    assert text[1][text[2].index("^"):] == "0X0"
