"""`placement=` beside `use`: a named shape takes the generator's stage count; a mismatch is a
located PPS011 in every command, never an internal error."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppdsl.cli import main
from ppdsl.diagnostics import PpsError
from ppdsl.expansion import parse


@pytest.mark.parametrize("header, use, placement", [
    ("ranks=2 microbatches=2 placement=v", "1f1b()", (0, 1)),
    ("ranks=2 microbatches=4 placement=loop", "interleaved_1f1b(virtual=2)", (0, 1, 0, 1)),
    ("ranks=2 microbatches=4 placement=v", "zbv()", (0, 1, 1, 0)),
])
def test_a_named_placement_without_stages_fits_the_generator(header: str, use: str,
                                                             placement: tuple[int, ...]) -> None:
    program = parse(f"pipeline {header}\nuse {use}\n")
    assert program.placement == placement and program.stages == len(placement)


@pytest.mark.parametrize("header, use, message", [
    ("ranks=2 microbatches=4 placement=v", "interleaved_1f1b(virtual=2)",
     "`interleaved_1f1b` places its 4 stages as [0, 1, 0, 1], not as `placement=v` ([0, 1, 1, 0])"),
    ("ranks=2 microbatches=2 placement=[0,1,1,0]", "1f1b()",
     "`1f1b` places its 2 stages as [0, 1], not as the header's placement ([0, 1, 1, 0])"),
    ("ranks=2 microbatches=2 stages=4 placement=v", "1f1b()",
     "`1f1b` makes 2 stages but the header says stages=4"),
])
def test_a_placement_the_generator_does_not_make_is_located(header: str, use: str, message: str) -> None:
    with pytest.raises(PpsError) as info:
        parse(f"pipeline {header}\nuse {use}\n", "x.pps")
    (d,) = info.value.diagnostics
    assert (d.code, d.message, d.line) == ("PPS011", message, 1)
    text = f"pipeline {header}"
    option = "stages=" if "header says" in message else "placement="
    assert d.column == text.index(option) + 1


@pytest.mark.parametrize("command", ["lint", "expand", "simulate", "show", "fmt"])
def test_every_command_reports_it(tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "x.pps"
    path.write_text("pipeline ranks=2 microbatches=4 placement=v\nuse interleaved_1f1b(virtual=2)\n")
    assert main([command, str(path)]) == 1
    out = capsys.readouterr()
    assert "error[PPS011]" in out.out + out.err and "internal error" not in out.err
