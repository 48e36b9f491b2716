"""DualPipeV against the real PyTorch schedule file."""

from __future__ import annotations

from pathlib import Path

from gen_helpers import build, measure, problems
from ppdsl.load import load_program


def test_matches_pytorch_file_and_is_no_worse(vectors: Path) -> None:
    ours = build("dualpipev", 4, 10)
    theirs = load_program(str(vectors / "dualpipev_4rank_10mb.csv"))
    assert not problems(ours)
    assert ours.placement == theirs.placement
    assert measure(ours)[1] <= measure(theirs)[1]
    # It is in fact PyTorch's schedule, action for action.
    assert ours.rows == theirs.rows


def test_overlapped_pairs_in_steady_state() -> None:
    text = " ".join(str(s) for s in build("dualpipev", 4, 10).rows[0])
    assert "(0F7;7B3)" in text
