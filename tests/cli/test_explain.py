"""`ppdsl lint --explain CODE` explains every code ppdsl can emit, in any case."""

from __future__ import annotations

import pytest

from ppdsl.cli import main
from ppdsl.codes import CODES


@pytest.mark.parametrize("code", sorted(CODES))
def test_every_code_is_explained(code: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", "--explain", code]) == 0
    out = capsys.readouterr().out
    head, _, body = out.partition("\n\n")
    assert head == f"{code}: {CODES[code]}"
    assert "**Fix:**" in body, out  # the section of docs/language.md, not just the summary


@pytest.mark.parametrize("spelling", ["pps003", " Pps003 "])
def test_the_code_is_read_in_any_case(spelling: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", "--explain", spelling]) == 0
    assert capsys.readouterr().out.startswith("PPS003: malformed action token\n")


def test_a_checker_code_names_the_family_that_reports_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", "--explain", "PPS210"]) == 0
    out = capsys.readouterr().out
    assert "`deadlock` family" in out and "ppdsl/check/deadlock.py" in out


def test_an_unknown_code_is_a_usage_error_with_the_closest(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", "--explain", "PPS21"]) == 2
    err = capsys.readouterr().err
    assert "no diagnostic code `PPS21`" in err and "did you mean `PPS212`?" in err and "Traceback" not in err


def test_an_empty_code_is_told_as_no_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", "--explain", ""]) == 2
    assert "ppdsl lint: error: no diagnostic code ``" in capsys.readouterr().err
