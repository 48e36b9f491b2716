"""Whatever `convert` writes, `convert` reads back: to the same program, or (a loss the CSV
forces) to the same shape with a PPS031 warning saying what was lost; an output that would
not read back is refused with the reason and nothing is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppdsl.cli import main
from ppdsl.load import load_program

# Inputs with lint errors (duplicates, a missing backward, a stage on the wrong rank, ...):
# the conversion keeps them, as written.
BROKEN = [
    "pipeline ranks=2 microbatches=2\nrank 0: 0F0 0F0 0B0 0F1 0B1\nrank 1: 1F0 1B0 1F1 1B1\n",
    "pipeline ranks=2 microbatches=1\nrank 0: 0F0 1F0\nrank 1: 1B0\n",
    "pipeline ranks=2 microbatches=1 stages=3\nrank 0: 0F0 2F0\nrank 1: 1F0\n",
    "pipeline ranks=2 microbatches=2\nrank 0: (0F1;0B0) 0F0 0B1\nrank 1: 1F0 1B0 1F1 1B1\n",
    "pipeline ranks=2 microbatches=1 placement=[1,0]\nrank 0: 1F0\nrank 1: 0F0\n",
    "pipeline ranks=2 microbatches=1\nrank 0: 0SEND_F0 0UNSHARD 0REDUCE_GRAD\nrank 1: 1RECV_F0\n",
    "pipeline ranks=2 microbatches=4\nrank 0: 0F3\nrank 1: 1F3\n",
]


@pytest.mark.parametrize("text", BROKEN)
def test_pps_to_csv_to_pps_keeps_the_program(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> None:
    src, csv, back = tmp_path / "in.pps", tmp_path / "out.csv", tmp_path / "back.pps"
    src.write_text(text)
    assert main(["convert", str(src), str(csv)]) == 0
    assert main(["convert", str(csv), str(back)]) == 0
    a, b = load_program(str(src)), load_program(str(back))
    assert (a.ranks, a.stages, a.placement, a.rows, a.microbatches) == (b.ranks, b.stages, b.placement, b.rows,
                                                                         b.microbatches)
    assert "PPS031" not in capsys.readouterr().err


def test_what_a_csv_cannot_hold_is_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, csv = tmp_path / "in.pps", tmp_path / "out.csv"
    src.write_text("pipeline ranks=2 microbatches=3 mode=inference memory=2\ncosts F=2\nrank 0: 0F0\nrank 1: 1F0\n")
    assert main(["convert", str(src), str(csv)]) == 0
    err = capsys.readouterr().err
    assert f"{src}:1:1: warning[PPS031]: PyTorch's CSV has no place for the mode (`mode=inference`)" in err
    assert f"{src}:1:1: warning[PPS031]: PyTorch's CSV has no place for the memory limit" in err
    assert f"{src}:2:1: warning[PPS031]: PyTorch's CSV has no place for the `costs` line" in err
    assert "the header says microbatches=3 but the rows use 1" in err
    assert main(["convert", str(csv), str(tmp_path / "back.pps")]) == 0


def test_an_output_that_would_not_read_back_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, csv = tmp_path / "in.pps", tmp_path / "out.csv"
    src.write_text("pipeline ranks=1 microbatches=1\nrank 0:\n")
    assert main(["convert", str(src), str(csv)]) == 1
    err = capsys.readouterr().err
    assert "error[PPS031]: not written: the CSV would not read back (empty CSV: no rank rows)" in err
    assert not csv.exists()


def test_a_csv_whose_dialect_would_be_misread_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Found by scripts/fuzz.py: `B` then `W` reads as the legacy dialect, where `I` is no action.
    src, csv = tmp_path / "in.pps", tmp_path / "out.csv"
    src.write_text("pipeline ranks=3 microbatches=1\n"
                   "rank 0: 0SEND_B{0..0} 0I{0..0} [0F{0..0} 0B{0..0}] (0F0;0B0) 0W0 <3SEND_F0 3RECV_B0>\n"
                   "rank 1: <1SEND_F0 1RECV_B0>\nrank 2: <2SEND_F0 2RECV_B0> 1W{0..0} 2B0\n")
    assert main(["convert", str(src), str(csv)]) == 1
    assert "error[PPS031]: not written: the CSV would not read back (malformed action `0I0` (legacy dialect))" \
        in capsys.readouterr().err
    assert not csv.exists()
