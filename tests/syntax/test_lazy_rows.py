"""Rows a reader keeps as integers (`ir.LazyRows`) against the same rows made as actions: the
same program, the same encoding, the same text printed, the same diagnostics; and the passes
that only need the integers (lint, expand, convert) make no Action object."""

from __future__ import annotations

import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from ppdsl.check import check
from ppdsl.encoding import Encoded, read_rows
from ppdsl.diagnostics import PpsError
from ppdsl.formats.torch_csv import read_csv, write_csv
from ppdsl.ir import IDLE, LazyRows, Program, make_action, Kind, row_length, trailing_idle
from ppdsl.load import check_slots
from ppdsl.syntax import scan
from ppdsl.expansion import parse
from ppdsl.syntax.printer import print_program

STAGES, MICROBATCHES = 4, 5
plain = st.builds(lambda s, k, m: f"{s}{k.name}{'' if k.stage_only else m}",
                  st.integers(0, STAGES - 1), st.sampled_from(list(Kind)), st.integers(0, MICROBATCHES - 1))
# Mostly plain tokens (with idle ones and leading zeros); now and then an item that makes the
# row be built as steps: a range, an overlapped pair, a batch.
word = st.one_of(plain, plain, plain, st.just("_"), st.just("01F002"),
                 st.just("0F{0..2}"), st.just("(0F1;1B0)"), st.just("<0SEND_F1 1RECV_F1>"))


def as_actions(program: Program) -> Program:
    """The reference: the same program with every row made as a tuple of steps."""
    return program.evolve(rows=tuple(tuple(row) for row in program.rows))


def encodings_agree(program: Program, reference: Program) -> None:
    fast, slow = Encoded(program, read=read_rows(program)), Encoded(reference)
    assert (fast.codes, fast.steps, fast.groups, fast.invalid) == (slow.codes, slow.steps, slow.groups, slow.invalid)
    # What the reader's stage-kinds answer (read rows) equals what the codes say (the others).
    assert fast.kinds == slow.kinds
    assert [fast.stages_of(r) for r in range(len(fast.codes))] == [slow.stages_of(r) for r in range(len(slow.codes))]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(word, max_size=12), min_size=1, max_size=4), st.booleans())
def test_a_pps_read_as_integers_is_the_program_its_actions_make(rows: list[list[str]], header_stages: bool) -> None:
    shape = f" stages={STAGES} placement=loop" if header_stages else ""
    text = f"pipeline ranks={len(rows)} microbatches={MICROBATCHES}{shape}\n" + "".join(
        f"rank {r}: {' '.join(words)}\n" for r, words in enumerate(rows))
    try:
        program = parse(text, "p.pps")
    except Exception as exc:  # stages without placement may be left without a rank: PPS016
        assert "PPS016" in str(getattr(exc, "diagnostics", exc))
        return
    reference = as_actions(program)
    assert program == reference and reference == program and hash(program) == hash(reference)
    assert program.action_count == reference.action_count
    encodings_agree(program, reference)
    assert print_program(program) == print_program(reference)
    assert csv_or_refusal(program) == csv_or_refusal(reference)
    for rank in range(program.ranks):
        assert row_length(program.rows, rank) == len(reference.rows[rank])
        assert trailing_idle(program.rows, rank) == trailing_idle(reference.rows, rank)
    assert check(program) == check(reference)
    spans_point_at_their_tokens(program, text)


def csv_or_refusal(program: Program) -> object:
    """What `write_csv` writes, or the errors it refuses with (a kind PyTorch's CSV lacks)."""
    try:
        return write_csv(program)
    except PpsError as exc:
        return exc.diagnostics


def spans_point_at_their_tokens(program: Program, text: str) -> None:
    """Each step read from a run of plain tokens is located at its own token (the runs' first
    step indices are counted by the integer rows as they are read)."""
    lines = text.split("\n")
    for rank, row in enumerate(program.rows):
        for index, step in enumerate(row):
            span = program.source.step_span(rank, index)  # type: ignore[union-attr]
            if span.end_column is None:
                continue  # a range, a zip member, a pair or a batch: located at its item
            written = lines[span.line - 1][span.column - 1:span.end_column - 1]
            if written == "_":
                assert step is IDLE
            elif "{" not in written and written[:1] not in "(<":
                assert str(scan.parse_word(written, 0, (STAGES, MICROBATCHES))) == str(step), (rank, index, written)


cell = st.one_of(plain, plain, st.just(""), st.just("(0F1;1B0)OVERLAP_F_B"), st.just(" 1F0"))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(cell, max_size=10), min_size=1, max_size=4))
def test_a_csv_read_as_integers_is_the_program_its_actions_make(rows: list[list[str]]) -> None:
    text = "".join(",".join(cells) + "\n" for cells in rows)
    try:
        program = read_csv(text, "c.csv")
    except Exception as exc:  # no action at all, a stage with no row: located errors, not this test's
        assert getattr(exc, "diagnostics", None)
        return
    reference = as_actions(program)
    assert program == reference and program.action_count == reference.action_count
    encodings_agree(program, reference)
    assert print_program(program) == print_program(reference)
    assert write_csv(program) == write_csv(reference)
    assert check(program) == check(reference)


def test_lint_expand_and_convert_make_no_action_of_a_plain_file() -> None:
    rows = [" ".join(f"{r}F{m}" for m in range(6)) + " " + " ".join(f"{r}B{m}" for m in range(6)) + " _"
            for r in range(3)]
    text = "pipeline ranks=3 microbatches=6\n" + "".join(f"rank {r}: {row}\n" for r, row in enumerate(rows))
    for program in (parse(text, "p.pps"), read_csv(write_csv(parse(text))[0], "p.csv")):
        assert isinstance(program.rows, LazyRows)
        check_slots(program, "p")
        found = check(program)
        print_program(program)
        write_csv(program)
        assert program.rows.made == [None] * 3, "a pass made Action objects it does not need"
        assert [d.code for d in found if not d.is_error] and not [d for d in found if d.is_error]  # PPS403 warnings
        # Asked for, the steps are made, once, and stay.
        row = program.rows[1]
        assert row[0] == make_action(1, Kind.F, 0) and row[-1] is IDLE and program.rows[1] is row


def test_lazy_rows_behave_as_the_tuple_they_stand_for() -> None:
    program = parse("pipeline ranks=2 microbatches=2\nrank 0: 0F0 0F1 0B0 0B1\nrank 1: 1F0 _ 1B0\n")
    rows, made = program.rows, tuple(tuple(r) for r in program.rows)
    assert rows == made and made == rows and hash(rows) == hash(made) and repr(rows) == repr(made)
    assert rows[0:1] == made[0:1] and rows[-1] == made[-1] and list(rows) == list(made)
    assert pickle.loads(pickle.dumps(program)) == program
    other = parse("pipeline ranks=2 microbatches=2\nrank 0: 0F0 0F1 0B0 0B1\nrank 1: 1F0 1B0\n")
    assert program != other and other.rows != rows
