"""What well-formed .pps text means: ranges, zips, pairs, batches, rows, placement, spans."""

from __future__ import annotations

import pytest

from ppdsl.ir import IDLE, Action, Batch, Kind, Overlap, Program
from ppdsl.expansion import parse
from ppdsl.syntax.printer import print_program

F, B = Kind.F, Kind.B


def row(text: str, header: str = "pipeline ranks=2 microbatches=8 stages=4 placement=loop") -> tuple[str, ...]:
    return tuple(map(str, parse(header + "\nrank 0: " + text + "\n").rows[0]))


def test_issue_example_1f1b() -> None:
    p = parse("""\
# 1F1B, 4 ranks, 8 microbatches, written out by hand
pipeline ranks=4 microbatches=8            # header

rank 0: 0F{0..3} [0F{4..7} 0B{0..3}] 0B{4..7}
rank 1: _ 1F{0..2} [1F{3..7} 1B{0..4}] 1B{5..7}
rank 2: _ _ 2F{0..1} [2F{2..7} 2B{0..5}] 2B{6..7}
rank 3: _ _ _ [3F{0..7} 3B{0..7}]
""")
    assert (p.ranks, p.stages, p.microbatches, p.placement, p.mode) == (4, 4, 8, (0, 1, 2, 3), "train")
    assert tuple(map(str, p.rows[0])) == tuple("0F0 0F1 0F2 0F3 0F4 0B0 0F5 0B1 0F6 0B2 0F7 0B3 0B4 0B5 0B6 0B7".split())
    assert p.rows[3][:3] == (IDLE, IDLE, IDLE)
    assert p.action_count == 4 * 16
    assert all(len([a for a in r if a != IDLE]) == 16 for r in p.rows)


@pytest.mark.parametrize("text, expected", [
    ("0F{0..3}", "0F0 0F1 0F2 0F3"),
    ("0F{3..1}", "0F3 0F2 0F1"),
    ("0F{2..2}", "0F2"),
    ("{0..3}F0", "0F0 1F0 2F0 3F0"),
    ("{0..3}F{4..7}", "0F4 1F5 2F6 3F7"),
    ("0F{ 0 .. 1 }", "0F0 0F1"),
    ("[0F{4..7} 0B{0..3}]", "0F4 0B0 0F5 0B1 0F6 0B2 0F7 0B3"),
    ("[0F{0..1} 0I{0..1} 0W{0..1}]", "0F0 0I0 0W0 0F1 0I1 0W1"),
    ("[0F0 0B0] [0F1 0B1]", "0F0 0B0 0F1 0B1"),
    ("{0..1}UNSHARD 0F0 {1..0}RESHARD", "0UNSHARD 1UNSHARD 0F0 1RESHARD 0RESHARD"),
    ("0SEND_F{0..1} 1RECV_B3 0REDUCE_GRAD", "0SEND_F0 0SEND_F1 1RECV_B3 0REDUCE_GRAD"),
    ("00F07", "0F7"),
    ("_ 0F0 _", "_ 0F0 _"),
])
def test_ranges_and_zips_expand(text: str, expected: str) -> None:
    assert row(text) == tuple(expected.split())


def test_overlapped_pairs_with_and_without_pytorch_suffix() -> None:
    p = parse("pipeline ranks=1 microbatches=8 stages=8 placement=[0,0,0,0,0,0,0,0]\n"
              "rank 0: (0F7;7B3)OVERLAP_F_B (0F{0..1}; 7B{2..3})\n")
    assert p.rows[0] == (Overlap((Action(0, F, 7), Action(7, B, 3))),
                         Overlap((Action(0, F, 0), Action(7, B, 2))),
                         Overlap((Action(0, F, 1), Action(7, B, 3))))


def test_batches_keep_their_parts_in_order() -> None:
    p = parse("pipeline ranks=2 microbatches=4\nrank 0: 0F0 <0SEND_F0   0RECV_B0> <1RECV_F2>\n")
    assert p.rows[0][1:] == (Batch((Action(0, Kind.SEND_F, 0), Action(0, Kind.RECV_B, 0))),
                             Batch((Action(1, Kind.RECV_F, 2),)))


def test_rows_continue_across_lines_and_comments() -> None:
    text = """pipeline ranks=2 microbatches=4   # trailing comment
rank 0:            # nothing yet on this line
   0F0 0F1
# a comment line inside the row
   [0F{2..3} 0B{0..1}]

   0B{2..3}
rank 1: 1F{0..3} 1B{0..3}
"""
    p = parse(text)
    assert tuple(map(str, p.rows[0])) == tuple("0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3".split())
    assert len(p.rows[1]) == 8


@pytest.mark.parametrize("transform", [
    lambda t: t.replace("\n", "\r\n"),
    lambda t: "\ufeff" + t,
    lambda t: t.replace(" ", "\t"),
    lambda t: t.rstrip("\n"),
    lambda t: "\n\n  " + t.replace("\n", "\n\n"),
])
def test_line_endings_bom_tabs_and_blank_lines_change_nothing(transform: object) -> None:
    text = "pipeline ranks=2 microbatches=2\nrank 0: 0F0 [0F1 0B0] 0B1\nrank 1: 1F{0..1} 1B{0..1}\n"
    assert parse(transform(text)) == parse(text)  # type: ignore[operator]


def test_empty_and_missing_rows_are_empty() -> None:
    p = parse("pipeline ranks=3 microbatches=1\nrank 0:\nrank 2: 0F0\n")
    assert p.rows == ((), (), (Action(0, F, 0),))


@pytest.mark.parametrize("header, placement, stages", [
    ("pipeline ranks=2 microbatches=1 placement=loop stages=4", (0, 1, 0, 1), 4),
    ("pipeline ranks=2 microbatches=1 placement=v", (0, 1, 1, 0), 4),
    ("pipeline ranks=2 microbatches=1 placement=[1,0,0]", (1, 0, 0), 3),
    ("pipeline ranks=3 microbatches=1", (0, 1, 2), 3),
])
def test_header_placement(header: str, placement: tuple[int, ...], stages: int) -> None:
    p = parse(header + "\n")
    assert (p.placement, p.stages) == (placement, stages)


def test_placement_and_stage_count_inferred_from_rows() -> None:
    p = parse("pipeline ranks=2 microbatches=1\nrank 0: 0F0 3F0\nrank 1: 1F0 2F0\n")
    assert (p.stages, p.placement) == (4, (0, 1, 1, 0))


def test_header_options_memory_mode_costs() -> None:
    p = parse("pipeline mode=inference memory=2.5 microbatches=2 ranks=1\ncosts F=1 B=2.0 comm=0.25\nrank 0: 0F{0..1}\n")
    assert (p.mode, p.memory_limit, p.costs) == ("inference", 2.5, (("F", 1.0), ("B", 2.0), ("comm", 0.25)))


def test_generators_fill_every_rank() -> None:
    p = parse("pipeline ranks=4 microbatches=8\nuse 1f1b()\n")
    q = parse(print_program(p))
    assert p == q and p.generated is not None and p.generated.name == "1f1b"
    assert tuple(map(str, p.rows[3])) == tuple("3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 3F6 3B6 3F7 3B7".split())
    g = parse("pipeline ranks=2 microbatches=2\nuse fthenb()\n")
    assert g.generated is not None and g.generated.name == "gpipe"
    assert tuple(map(str, g.rows[1])) == ("1F0", "1F1", "1B0", "1B1")
    inf = parse("pipeline ranks=2 microbatches=2 mode=inference\nuse 1f1b()\n")
    assert all(a.kind is F for _, _, a in inf.actions())


def test_equality_ignores_layout_but_not_meaning() -> None:
    a = parse("pipeline ranks=1 microbatches=2\nrank 0: 0F{0..1}\n")
    b = parse("pipeline   microbatches=2 ranks=1  # x\n\nrank 0:\n 0F0\n 0F1\n", "other.pps")
    c = parse("pipeline ranks=1 microbatches=2\nrank 0: 0F{1..0}\n")
    assert a == b and a != c and isinstance(a, Program)


def test_step_spans_point_at_each_token() -> None:
    text = "pipeline ranks=1 microbatches=4\nrank 0: 0F0  0F1\n   0F{2..3} [0B0 0B1] (0F0;0B2)\n"
    p = parse(text, "s.pps")
    assert p.source is not None
    spans = [p.source.step_span(0, i) for i in range(len(p.rows[0]))]
    assert [(s.line, s.column) for s in spans] == [(2, 9), (2, 14), (3, 4), (3, 4), (3, 14), (3, 18), (3, 23)]
    assert spans[1].end_column == 17
