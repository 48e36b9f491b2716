"""Cost problems name what the user wrote, and a bad `costs` line fails `lint`, located."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import SCHEDULES
from ppdsl.check import check
from ppdsl.cli import main
from ppdsl.costs import CostError, parse_inline
from ppdsl.expansion import parse


@pytest.mark.parametrize("spec, message", [
    ("B=1,I=2", "`B=1` is less than `I=2`"),
    ("B=1,W=3", "`B=1` is less than `W=3`"),
    ("B=1,I_s1=2", "`B=1` is less than `I_s1=2`"),
    ("B_s0=1,W=2", "`B_s0=1` is less than `W=2`"),
])
def test_a_backward_cheaper_than_its_part_cites_the_given_keys(spec: str, message: str) -> None:
    with pytest.raises(CostError) as info:
        parse_inline(spec).table(2)
    assert (info.value.code, info.value.message) == ("PPS351", message)


@pytest.mark.parametrize("spec", ["", "  "])
def test_an_empty_costs_flag_says_so(spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(SCHEDULES / "1f1b.pps"), "--costs", spec]) == 2
    assert capsys.readouterr().err == ("ppdsl simulate: error: --costs: empty; give costs such as "
                                       "F=1,B=2,comm=0.1 or a .json profile file\n")


@pytest.mark.parametrize("line, code, message, column, end", [
    ("costs F=1 Q=1", "PPS350", "unknown cost `Q`", 11, 14),
    ("costs F_s7=1", "PPS350", "cost `F_s7` names stage 7 but the program has 2 stages", 7, 13),
    ("costs B=1 I=2", "PPS351", "`B=1` is less than `I=2`", 7, 10),
])
def test_a_bad_costs_line_is_a_checker_error_on_that_line(line: str, code: str, message: str, column: int,
                                                         end: int) -> None:
    program = parse(f"pipeline ranks=2 microbatches=2\n{line}\nuse 1f1b()\n", "x.pps")
    (d,) = check(program)
    assert (d.code, d.message, d.line, d.column, d.end_column) == (code, message, 2, column, end)


def test_a_costs_key_is_located_where_the_parser_read_it_in_a_file_of_rows() -> None:
    # The key's own place, not the first text like it: `Q=1` in the comment comes later.
    program = parse("pipeline ranks=1 microbatches=1\ncosts  F=1   Q=2  # not Q=1\nrank 0: 0F0 0B0\n", "x.pps")
    (d,) = check(program)
    assert (d.code, d.line, d.column, d.end_column) == ("PPS350", 2, 14, 17)


def test_a_form_feed_in_an_earlier_comment_does_not_move_the_location() -> None:
    program = parse("pipeline ranks=2 microbatches=2\n# a\x0cb\ncosts F=1 Q=1\nuse 1f1b()\n", "x.pps")
    (d,) = check(program)
    assert (d.code, d.line, d.column, d.end_column) == ("PPS350", 3, 11, 14)


def test_lint_fails_on_a_bad_costs_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "q.pps"
    path.write_text("pipeline ranks=2 microbatches=2\ncosts Q=1\nuse 1f1b()\n")
    assert main(["lint", str(path)]) == 1
    assert capsys.readouterr().out.startswith(f"{path}:2:7: error[PPS350]: unknown cost `Q`\n")


@pytest.mark.parametrize("spec, message", [
    (",", "--costs ,: neither costs such as F=1,B=2,comm=0.1 nor a profile file"),
    ("F", "--costs F: neither costs such as F=1,B=2,comm=0.1 nor a profile file"),
    ("missing.json", "--costs missing.json: no such file"),
])
def test_a_costs_flag_that_is_neither_costs_nor_a_file(tmp_path: Path, spec: str, message: str,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", str(SCHEDULES / "1f1b.pps"), "--costs", spec]) == 2
    assert capsys.readouterr().err == f"ppdsl simulate: error: {message}\n"
