"""Counts agree with their nouns wherever ppdsl prints one, and advice fits the input's format."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppdsl.check import check
from ppdsl.cli import main
from ppdsl.diagnostics import PpsError
from ppdsl.wording import plural
from ppdsl.formats.torch_csv import read_csv, write_csv
from ppdsl.expansion import parse


@pytest.mark.parametrize("count, noun, shown, expected", [
    (1, "step", None, "1 step"), (2, "step", None, "2 steps"), (0, "error", None, "0 errors"),
    (1.0, "time unit", "1", "1 time unit"), (0.5, "time unit", "0.5", "0.5 time units"),
    (1024, "action", None, "1,024 actions"), (8, "microbatch", None, "8 microbatches"),
    (1, "microbatch", None, "1 microbatch"),
])
def test_plural(count: float, noun: str, shown: str | None, expected: str) -> None:
    assert plural(count, noun, shown) == expected


def test_a_one_step_simulation_reads_in_the_singular(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "one.pps"
    path.write_text("pipeline ranks=1 microbatches=1 mode=inference\nrank 0: 0F0\n")
    assert main(["simulate", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{path}: 1 rank, 1 stage, 1 microbatch, 1 action, comm model rendezvous"
    assert lines[-2].startswith("critical path: 1 step; ")


def test_a_one_part_batch_is_one_separate_cell() -> None:
    program = parse("pipeline ranks=2 microbatches=1\nrank 0: 0F0 <0SEND_F0> 0RECV_B0 0B0\n"
                    "rank 1: 1RECV_F0 1F0 1B0 1SEND_B0\n")
    _, warnings = write_csv(program, "current")
    assert [w.message for w in warnings] == ["PyTorch's CSV has no batches: `<0SEND_F0>` written as 1 separate cell"]


def test_trailing_idle_steps_advice_fits_the_format() -> None:
    (pps,) = check(parse("pipeline ranks=2 microbatches=1\nrank 0: 0F0 0B0 _\nrank 1: 1F0 1B0\n"))
    assert (pps.code, pps.message, pps.help) == ("PPS403", "rank 0 ends with 1 idle step",
                                                 "delete the trailing `_`: they do nothing")
    (csv,) = check(read_csv("0F0,0B0,,\n1F0,1B0\n", "x.csv"))
    assert (csv.code, csv.message) == ("PPS403", "rank 0 ends with 2 idle steps")
    assert csv.help == "delete the empty cells at the end of the row (its trailing commas): they do nothing"


@pytest.mark.parametrize("written, meant", [("FThenB", "fthenb"), ("ZBV", "zbv"), ("GPipe", "gpipe"), ("onef1b", "1f1b")])
def test_generator_names_are_suggested_whatever_their_case(written: str, meant: str) -> None:
    with pytest.raises(PpsError) as info:
        parse(f"pipeline ranks=2 microbatches=2\nuse {written}()\n")
    (d,) = info.value.diagnostics
    assert d.code == "PPS020" and d.help is not None and d.help.startswith(f"did you mean `{meant}`? ")


def test_did_you_mean_names_the_closest_choice_whatever_its_case() -> None:
    from ppdsl.wording import closest, did_you_mean

    assert did_you_mean("rank", ["ranks", "microbatches", "stages"]) == "did you mean `ranks`? "
    assert closest("FTHENB", ["fthenb", "1f1b"]) == "fthenb"
    assert did_you_mean("zzz", ["ranks", "microbatches"]) == ""
