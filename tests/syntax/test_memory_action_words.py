"""`R`, `OFFLOAD` and `RELOAD` read the same through the fast reader and the careful path (a row
holding one is read word by word: their names end in letters that stand inside other names,
`RECV_F`'s R, `SEND_F`'s D), rows without them are still read whole, and a typo of one is told
with a did-you-mean."""

from __future__ import annotations

import pytest

from ppdsl.diagnostics import PpsError
from ppdsl.expansion import parse
from ppdsl.formats.torch_csv import CurrentDialect
from ppdsl.ir import KIND_BY_NAME, Kind
from ppdsl.syntax.formatter import format_text
from ppdsl.syntax.scan import PlainRuns, cut_letters

ROWS = [
    "0F0 0R0 _ 0OFFLOAD0 0RELOAD0 0B0",
    "0RECV_F1 0SEND_B2 1UNSHARD 0RELOAD1 1REDUCE_GRAD 2RESHARD",
    "10OFFLOAD11 _ _ 3R12 2SEND_F7 2RECV_B7",
]


@pytest.mark.parametrize("row", ROWS)
def test_the_whole_run_reader_leaves_their_rows_to_the_word_by_word_reader(row: str) -> None:
    assert PlainRuns(KIND_BY_NAME, " ", "_").read(row) is None


def test_rows_of_the_other_kinds_are_read_whole_and_cut_at_f_i_w_b_only() -> None:
    runs = PlainRuns(KIND_BY_NAME, " ", "_")
    row = "0RECV_F1 0SEND_B2 1UNSHARD 0F1 1REDUCE_GRAD 2RESHARD _ 3B4"
    codes = runs.read(row)
    assert codes is not None, "read word by word instead of whole"
    kinds = [None if w == "_" else KIND_BY_NAME[w.strip("0123456789")] for w in row.split()]
    assert [None if sk is None else Kind(sk & 15) for sk in codes[0]] == kinds
    # Cut after F, I, W, B alone: no letter inside another name, nothing to put back.
    assert cut_letters(KIND_BY_NAME, " ") == (["B", "F", "I", "W"], [], [])
    # The CSV's names cut the same; its stage-only names after their whole name.
    assert cut_letters(CurrentDialect.read_names, ",")[0] == ["B", "F", "I", "W"]
    assert PlainRuns(CurrentDialect.read_names, ",", "").stage_only_names == ["UNSHARD", "RESHARD", "REDUCE_GRAD"]


@pytest.mark.parametrize("row", [
    *ROWS, "0F0 0OFFLOAD0 0F1 0RELOAD0 0B0 0R1 0B1", "0R1 0F1", "0OFFLOAD0 0R0 0R0", "0F{0..1} 0R{1..0}",
])
def test_whole_runs_and_the_careful_path_give_the_same_program(row: str) -> None:
    text = f"pipeline ranks=1 microbatches=13 stages=11 placement=[{','.join(['0'] * 11)}]\nrank 0: {row}\n"
    fast, careful = parse(text, "p.pps"), parse(text, "p.pps", whole_runs=False)
    assert fast == careful and fast.rows == careful.rows
    assert parse(format_text(text), "p.pps") == fast


@pytest.mark.parametrize(("word", "hint"), [
    ("0r3", "did you mean `0R3`?"),
    ("0offload3", "did you mean `0OFFLOAD3`?"),
    ("0Reload3", "did you mean `0RELOAD3`?"),
    ("0OFLOAD3", "kind one of F, I, W, B, R, OFFLOAD, RELOAD"),
])
def test_a_typo_is_told_where_it_is(word: str, hint: str) -> None:
    text = f"pipeline ranks=1 microbatches=4\nrank 0: 0F3 {word} 0B3\n"
    for whole_runs in (True, False):
        with pytest.raises(PpsError) as exc:
            parse(text, "p.pps", whole_runs=whole_runs)
        (d,) = exc.value.diagnostics
        assert (d.code, d.line, d.column) == ("PPS003", 2, 13)
        assert hint in (d.help or ""), d.help
