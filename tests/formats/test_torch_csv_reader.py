"""The fast CSV reader: same programs as a cell-by-cell read, every number bounded before use,
every problem located, and the printer's cached token text equal to `str()` of each action."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ppdsl.check import check
from ppdsl.diagnostics import PpsError
from ppdsl.formats import torch_csv
from ppdsl.formats.torch_csv import read_csv, write_csv
from ppdsl.ir import IDLE, Action, Batch, Kind, Overlap, make_action
from ppdsl.expansion import parse
from ppdsl.syntax.printer import ActionText, print_program

LONG = "9" * 300


def located(text: str) -> tuple[str, int, int, str]:
    with pytest.raises(PpsError) as info:
        read_csv(text, "bad.csv")
    (d,) = info.value.diagnostics
    return d.code, d.line, d.column, d.message


# ---- issue 14's inputs: each a located error, at once ---------------------------------------

@pytest.mark.parametrize("text, code, line, column, says", [
    ("0F0,4294967296F0\n", "PPS014", 1, 5, "stage 4294967296"),
    ("0F0\n1B20000001\n", "PPS014", 2, 1, "microbatch 20000001"),
    (f"0F0,0B0,0F{LONG}\n", "PPS014", 1, 9, "more than 18 digits"),
    ("0F0,0B846744073709551616\n", "PPS014", 1, 5, "846744073709551616"),
    ("20000001REDUCE_GRAD\n", "PPS014", 1, 1, "stage 20000001"),
    (f"0F0, 0F{'9' * 5000}\n", "PPS014", 1, 6, "more than 18 digits"),  # past int()'s 4300 digits
    ("0F0,(0F1;99999999999B0)\n", "PPS014", 1, 5, "stage 99999999999"),
])
def test_numbers_past_the_limits_are_located_errors(text: str, code: str, line: int, column: int, says: str) -> None:
    got = located(text)
    assert got[:3] == (code, line, column) and says in got[3]


def test_a_stage_within_the_limit_but_with_gaps_is_pps016_not_a_million_stage_program() -> None:
    code, line, column, message = located("0F0,0B0\n1F0,1048575F0\n")
    assert (code, line, column) == ("PPS016", 2, 5)
    assert "1,048,576 stages" in message and "stages 2, 3, 4" in message


def test_a_microbatch_space_the_cells_cannot_cover_is_pps015() -> None:
    code, line, column, message = located("0F0,0B0,0F1048575\n")
    assert (code, line, column) == ("PPS015", 1, 9) and "3 cells" in message


def test_a_small_file_may_miss_microbatches_and_the_checker_names_them() -> None:
    program = read_csv("0F0,0F2,0B0,0B2\n", "gap.csv")
    assert program.microbatches == 3
    assert [d.code for d in check(program) if d.is_error]  # 0F1 / 0B1 missing: the checker's business


def test_too_many_rows_is_pps015() -> None:
    code, line, _, _ = located("0F0,0B0\n" + "\n" * torch_csv.MAX_RANKS)
    assert (code, line) == ("PPS015", torch_csv.MAX_RANKS + 1)


def test_too_many_cells_is_refused_before_the_row_is_split(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_csv, "MAX_ACTIONS", 10)
    code, line, _, message = located("0F0,0B0\n" + "," * 50 + "\n")
    assert (code, line) == ("PPS015", 2) and "10 cells" in message


def test_a_tiny_hostile_file_neither_allocates_nor_hangs(tmp_path: Path) -> None:
    """Through the command, in a child whose peak memory is measured: 50 bytes stay small."""
    f = tmp_path / "evil.csv"
    f.write_text("0F0,1048575F1048575,4294967296F0\n0B0,1B20000001\n")
    # VmHWM, not getrusage: on Linux ru_maxrss survives exec and would report this process's peak.
    script = ("import sys\nfrom ppdsl.cli import main\nrc = main(['lint', sys.argv[1]])\n"
              "peak = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
              "print('PEAK', peak, rc, file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", script, str(f)], capture_output=True, text=True, timeout=60)
    peak_kb, rc = (int(x) for x in done.stderr.split("PEAK")[1].split())
    assert rc == 1 and "error[PPS014]" in done.stdout and peak_kb < 200_000


# ---- the fast rows and the careful rows read the same thing ---------------------------------

MIXED = "0F0,0F1,,0B0,0UNSHARD,0B1,0RESHARD\n\n,1F0,1SEND_F0,1RECV_B0,1B0,1REDUCE_GRAD\n"


def test_blanks_around_cells_take_the_careful_path_and_read_the_same() -> None:
    spaced = MIXED.replace(",", " , ").replace(" \n", "\n")
    assert read_csv(spaced) == read_csv(MIXED)
    p = read_csv(MIXED)
    assert p.rows[0][2] is IDLE and p.rows[1] == () and p.rows[0][4] == Action(0, Kind.UNSHARD)
    assert (p.ranks, p.stages, p.microbatches, p.placement) == (3, 2, 2, (0, 2))


def test_leading_zeros_and_a_lone_stage_only_row() -> None:
    p = read_csv("00F01,0F0,0B0,0B1\n1UNSHARD\n")
    assert p.rows[0][0] == Action(0, Kind.F, 1) and p.rows[1] == (Action(1, Kind.UNSHARD),)


@pytest.mark.parametrize("text, column", [
    ("0F0,0F\n", 5),            # F needs a microbatch
    ("0F0,0UNSHARD1\n", 5),     # UNSHARD takes none
    ("0F0,12\n", 5),            # digits only
    ("0F0,F1\n", 5),            # no stage
    ("0F0,0f1\n", 5),           # lower case kind
    ("0F0,0F1x\n", 5),
    ("0F0,,0NOPE3\n", 6),
])
def test_cells_the_fast_path_refuses_are_located_by_the_careful_one(text: str, column: int) -> None:
    assert located(text)[:3] == ("PPS030", 1, column)


def test_legacy_b_is_resolved_on_fast_rows_too() -> None:
    p = read_csv("0F0,0F1,0B0,0B1,0W1,0BW2\n")  # BW: legacy, detected
    assert [str(a) for _, _, a in p.actions()] == ["0F0", "0F1", "0B0", "0I1", "0W1", "0B2"]


def test_a_checker_diagnostic_points_at_its_cell() -> None:
    program = read_csv("0F0,, 0F1,0B1\n", "c.csv")  # 0B0 missing
    found = [d for d in check(program) if d.is_error]
    assert found and all(d.line == 1 for d in found)
    span = program.source.step_span(0, 2)  # type: ignore[union-attr]
    assert (span.line, span.column, span.end_column) == (1, 7, 10)
    empty = program.source.step_span(0, 1)  # type: ignore[union-attr]
    assert (empty.column, empty.end_column) == (5, None)


# ---- printing through cached token text ----------------------------------------------------

def test_action_text_is_str_for_every_kind() -> None:
    text = ActionText()
    actions = [make_action(s, k, None if k.stage_only else m) for k in Kind for s in (0, 7, 130) for m in (0, 11)]
    assert text.actions(actions) == [str(a) for a in actions]
    assert [text.action(a) for a in actions] == [str(a) for a in actions]
    row = [actions[0], IDLE, Overlap((actions[0], make_action(3, Kind.B, 1))), Batch((make_action(1, Kind.SEND_F, 2),))]
    assert text.steps(row, text.pps_step) == [str(s) for s in row]


def test_printed_csv_reads_back_and_prints_the_same() -> None:
    p = read_csv(MIXED)
    assert read_csv(write_csv(p)[0]) == p
    assert parse(print_program(p)) == p
    legacy, warnings = write_csv(read_csv("0F0,0I0,0W0,0F1,0B1\n"), "legacy")
    assert legacy == "0F0,0B0,0W0,0F1,0BW1\n" and warnings == []


def test_lines_end_at_newline_as_the_excerpts_count_them() -> None:
    # \x0c and a lone \r are no line ends (str.splitlines would say they are): the error is on line 2.
    assert located("0F0,0B0\x0c\r\n1F0,1X0\r\n")[:3] == ("PPS030", 2, 5)
    assert read_csv("0F0,0B0\r\n\r\n").rows[1] == ()


def test_a_file_of_stage_only_actions_has_one_microbatch_not_zero() -> None:
    # It was microbatches=0, and the checker divided by it (an internal error at the command line).
    program = read_csv("0UNSHARD,0RESHARD\n", "s.csv")
    assert program.microbatches == 1
    assert isinstance(check(program), list)
