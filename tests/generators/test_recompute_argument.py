"""`recompute=` on every generator: an R just before each chosen (stage, microbatch)'s first
backward, the program it makes lints clean, and the docs' example is what `expand` prints."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ppdsl.check import check
from ppdsl.diagnostics import PpsError
from ppdsl.expansion import parse
from ppdsl.generators.registry import REGISTRY
from ppdsl.ir import Kind, actions_of

DOCS = Path(__file__).parents[2] / "docs" / "generators.md"
SEARCHED = {"search"}


def _program(call: str, ranks: int = 4, microbatches: int = 8) -> object:
    return parse(f"pipeline ranks={ranks} microbatches={microbatches}\nuse {call}\n", "t.pps")


def _actions(prog: object) -> list[list[object]]:
    return [[a for step in row for a in actions_of(step)] for row in prog.rows]  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", sorted(set(REGISTRY) - SEARCHED))
def test_recompute_all_puts_an_r_before_every_first_backward_and_lints_clean(name: str) -> None:
    prog = _program(f"{name}(recompute=all)", microbatches=8)
    plain = _program(f"{name}()", microbatches=8)
    for row, plain_row in zip(_actions(prog), _actions(plain)):
        assert [a for a in row if a.kind is not Kind.R] == plain_row  # type: ignore[attr-defined]
        backwards = {(a.stage, a.microbatch) for a in row if a.kind in (Kind.B, Kind.I)}  # type: ignore[attr-defined]
        # what the generator itself moves (pipeoffload's chunks) stays moved
        moved = {(a.stage, a.microbatch) for a in plain_row if a.kind is Kind.OFFLOAD}  # type: ignore[attr-defined]
        recomputed = [(a.stage, a.microbatch) for a in row if a.kind is Kind.R]  # type: ignore[attr-defined]
        assert sorted(recomputed) == sorted(backwards - moved)
        for i, a in enumerate(row):
            if a.kind is Kind.R:  # type: ignore[attr-defined]
                after = next(b for b in row[i + 1:] if (b.stage, b.microbatch) == (a.stage, a.microbatch))
                assert after.kind in (Kind.B, Kind.I)  # type: ignore[attr-defined]
    assert not [d for d in check(prog) if d.severity == "error"]  # type: ignore[arg-type]


def test_recompute_n_takes_the_first_n_of_each_window() -> None:
    prog = _program("1f1b(recompute=1)", ranks=2, microbatches=6)
    rows = _actions(prog)
    # Rank 0's window is 2 (two forwards before the first backward): microbatches 0, 2, 4.
    assert [a.microbatch for a in rows[0] if a.kind is Kind.R] == [0, 2, 4]  # type: ignore[attr-defined]
    # Rank 1's window is 1: every microbatch.
    assert [a.microbatch for a in rows[1] if a.kind is Kind.R] == [0, 1, 2, 3, 4, 5]  # type: ignore[attr-defined]
    assert _program("1f1b(recompute=none)").rows == _program("1f1b()").rows  # type: ignore[attr-defined]
    assert _program("1f1b(recompute=0)").rows == _program("1f1b()").rows  # type: ignore[attr-defined]


def test_inference_programs_have_no_r() -> None:
    prog = parse("pipeline ranks=2 microbatches=4 mode=inference\nuse 1f1b(recompute=all)\n", "t.pps")
    assert all(a.kind is Kind.F for row in _actions(prog) for a in row)  # type: ignore[attr-defined]


@pytest.mark.parametrize("value", ["some", "-1", "1.5"])
def test_a_bad_recompute_value_is_a_located_error(value: str) -> None:
    with pytest.raises(PpsError) as info:
        _program(f"1f1b(recompute={value})")
    d = info.value.diagnostics[0]
    assert d.code in ("PPS022", "PPS001", "PPS002") and d.line == 2


def test_the_documented_expansion_is_what_expand_prints(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from ppdsl.cli import main

    block = re.search(r"\$ ppdsl expand two.pps.*?\n(.*?)```", DOCS.read_text(), re.S)
    assert block
    f = tmp_path / "two.pps"
    f.write_text("pipeline ranks=2 microbatches=4\nuse 1f1b(recompute=all)\n")
    monkeypatch.chdir(tmp_path)
    assert main(["expand", "two.pps"]) == 0
    assert capsys.readouterr().out == block.group(1)


def test_offload_moves_after_the_forward_and_back_before_the_first_backward() -> None:
    prog = _program("1f1b(offload=all, recompute=1)", ranks=2, microbatches=4)
    rows = _actions(prog)
    words = [f"{a.stage}{a.kind.name}{a.microbatch}" for a in rows[0]]  # type: ignore[attr-defined]
    # Rank 0's window is 2: microbatches 0 and 2 recompute, 1 and 3 are offloaded.
    assert words == ["0F0", "0F1", "0OFFLOAD1", "0R0", "0B0", "0F2", "0RELOAD1", "0B1", "0F3", "0OFFLOAD3",
                     "0R2", "0B2", "0RELOAD3", "0B3"]
    assert not [d for d in check(prog) if d.severity == "error"]  # type: ignore[arg-type]
