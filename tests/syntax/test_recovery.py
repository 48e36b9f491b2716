"""One run tells every error of a file: reading goes on past a bad token, row or line."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppdsl.cli import main
from ppdsl.diagnostics import Diagnostic, PpsError
from ppdsl.limits import MAX_REPORTED_ERRORS
from ppdsl.expansion import parse


def errors(text: str, whole_runs: bool = True) -> list[Diagnostic]:
    with pytest.raises(PpsError) as info:
        parse(text, "x.pps", whole_runs=whole_runs)
    return list(info.value.diagnostics)


def where(found: list[Diagnostic]) -> list[tuple[str, int, int]]:
    return [(d.code, d.line, d.column) for d in found]


@pytest.mark.parametrize("whole_runs", [True, False])
def test_a_bad_token_on_each_of_two_rows(whole_runs: bool) -> None:
    found = errors("pipeline ranks=2 microbatches=2\nrank 0: 0F0 0X1 0B0 0B1\nrank 1: 1F0 1Q0 1F1 1B1\n", whole_runs)
    assert where(found) == [("PPS003", 2, 13), ("PPS003", 3, 13)]
    assert "`0X1`" in found[0].message and "`1Q0`" in found[1].message


def test_every_bad_token_of_one_run() -> None:
    found = errors("pipeline ranks=1 microbatches=2\nrank 0: 0F0 0X1 0F1 0B0 1b1\n")
    assert where(found) == [("PPS003", 2, 13), ("PPS003", 2, 25)]


@pytest.mark.parametrize("whole_runs", [True, False])
def test_syntax_errors_and_token_errors_together_in_file_order(whole_runs: bool) -> None:
    text = ("pipeline ranks=3 microbatches=2\n"
            "rank 0: 0F0 -0F1 0B0 0B1 0Z0\n"   # Lark refuses `-`; the rest of the line is still read
            "  0F1 [0B0 0B1\n"                 # an unclosed zip on a row's later line
            "rank 1: 1F0 1Q0 1F1 1B1\n"
            "rank 2: 2F0, 2F1\n"
            "rank 5: 2B0\n"
            "rank 0: 0B0 0B1\n")              # a plain run (read whole, Lark sees a stand-in), but a second row
    assert where(errors(text, whole_runs)) == [("PPS001", 2, 13), ("PPS003", 2, 26), ("PPS006", 3, 15), ("PPS003", 4, 13),
                                   ("PPS002", 5, 12), ("PPS013", 6, 6), ("PPS013", 7, 6)]


@pytest.mark.parametrize("text, expected", [
    # Leaving out the refused word would leave `[0F0 ` unclosed: that is not told again.
    ("pipeline ranks=1 microbatches=2\nrank 0: [0F0 -1] 0F1 0B0 0B1\n", [("PPS006", 2, 14)]),
    # A refused `use` line is left out whole (no "expected a generator" after it).
    ("pipeline ranks=1 microbatches=2\nuse 1f1b(virtual)\n", [("PPS002", 2, 17)]),
    # The header is lost: the rows are not checked against a header that is not there (no PPS010).
    ("pipeline ranks=2 microbatches=\nrank 0: 0F0 0b0\nrank 1: 1F0 -1\n", [("PPS002", 1, 31), ("PPS001", 3, 13)]),
])
def test_no_error_is_a_consequence_of_another(text: str, expected: list[tuple[str, int, int]]) -> None:
    assert where(errors(text)) == expected


def test_every_misspelt_header_option_with_its_suggestion() -> None:
    found = errors("pipeline rank=2 microbatch=2\nrank 0: 0F0 0B0\n")
    assert where(found) == [("PPS012", 1, 10), ("PPS012", 1, 17)]
    assert found[0].help is not None and found[0].help.startswith("did you mean `ranks`?")
    assert found[1].help is not None and found[1].help.startswith("did you mean `microbatches`?")


def test_reading_stops_after_the_cap_and_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    n = MAX_REPORTED_ERRORS + 500
    text = "pipeline ranks=1 microbatches=1\nrank 0: " + " ".join(["0X0"] * n) + "\n"
    found = errors(text)
    assert len(found) == MAX_REPORTED_ERRORS
    assert "stopped reading x.pps after 1,000 errors" in found[-1].notes[-1]
    path = tmp_path / "many.pps"
    path.write_text(text)
    assert main(["lint", str(path)]) == 1
    out = capsys.readouterr().out
    assert out.count("error[PPS003]") == 50 and f"... and {MAX_REPORTED_ERRORS - 50} more diagnostics" in out


@pytest.mark.parametrize("token, help_starts", [
    ("1b0", "did you mean `1B0`? kinds are upper case"),
    ("1send_b0", "did you mean `1SEND_B0`? kinds are upper case"),
    ("1f{0..1}", "did you mean `1F{0..1}`? kinds are upper case"),
    ("1BW1", "`BW` is PyTorch's legacy spelling of a full backward: write `1B1`; a legacy PyTorch CSV "
             "converts whole with `ppdsl convert FILE.csv FILE.pps`"),
])
def test_a_near_miss_token_says_what_was_meant(token: str, help_starts: str) -> None:
    (d,) = errors(f"pipeline ranks=2 microbatches=2\nrank 1: {token}\n")
    assert d.code == "PPS003" and (d.line, d.column) == (2, 9)
    assert d.help is not None and d.help.startswith(help_starts), d.help


def test_a_csv_tells_the_first_bad_cell_of_every_row() -> None:
    from ppdsl.formats.torch_csv import read_csv

    with pytest.raises(PpsError) as info:
        read_csv("0F0,0X1,0B0\n1F0,1B0\n1F1,1Q0\n", "x.csv")
    assert where(list(info.value.diagnostics)) == [("PPS030", 1, 5), ("PPS030", 3, 5)]


def test_an_error_on_every_row_costs_a_few_parses_of_each_line() -> None:
    import time

    n = 20_000  # one error a row: re-reading the rest of the file per error would take minutes
    text = f"pipeline ranks={n} microbatches=1\n" + "".join(f"rank {r}: 0F0 -1 0B0\n" for r in range(n))
    start = time.process_time()
    found = errors(text)
    assert len(found) == MAX_REPORTED_ERRORS and {d.code for d in found} == {"PPS001"}
    assert time.process_time() - start < 20
