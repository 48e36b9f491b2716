"""Runs read whole (`scan.PlainRuns`, and the parser's set-aside rows) against the careful way
of reading the same text: the same integers, the same program, the same positions, the same
diagnostics; and the text kept for a row is exactly what the printer writes for it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppdsl.diagnostics import PpsError
from ppdsl.formats.torch_csv import CurrentDialect, LegacyDialect, _Reader, read_csv
from ppdsl.ir import IDLE, KIND_BITS, KIND_BY_NAME, Kind, LazyRows, Program
from ppdsl import limits
from ppdsl.limits import MAX_MICROBATCHES, MAX_STAGES
from ppdsl.syntax import scan
from ppdsl.expansion import parse
from ppdsl.syntax.printer import ActionText, print_program

STAGES, MICROBATCHES = 4, 5
canonical = st.builds(lambda s, k, m: f"{s}{k.name}{'' if k.stage_only else m}",
                      st.integers(0, STAGES + 1), st.sampled_from(list(Kind)), st.integers(0, MICROBATCHES + 1))
# Mostly canonical tokens, some out of the header's bounds; and everything a run read whole
# must not take for one: idle and stage-only words, leading zeros, ranges, groups, unknown
# kinds, a kind's letter inside a word, comments, stray punctuation and other blanks.
odd = st.sampled_from(["_", "0UNSHARD", "01F2", "0F02", "0F{0..2}", "[0F1 0B0]", "(0F1;1B0)",
                       "<0SEND_F1 1RECV_F1>", "0X1", "0FB1", "F1", "0F", "1", "0F1#c", "0F1,", "0BW1",
                       "٣F1", "0F1\u00a0", "0\tF1", "0F1\r0F2", ";", "-1F0", "0F99999999999999999999"])
word = st.one_of(canonical, canonical, canonical, canonical, odd)
blank = st.sampled_from([" ", " ", " ", " ", "  ", "\t", " \t"])


@st.composite
def runs(draw: st.DrawFn) -> str:
    words = draw(st.lists(word, min_size=1, max_size=10))
    text = words[0]
    for w in words[1:]:
        text += draw(blank) + w
    return text


def careful_codes(text: str, separator: str, names: dict[str, Kind]) -> object:
    reader = scan.TokenReader(names, MAX_STAGES, MAX_MICROBATCHES, "_" if separator == " " else "", IDLE)
    return reader.codes(text.split(separator))


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(runs(), st.sampled_from([" ", ","]), st.sampled_from([CurrentDialect, LegacyDialect]))
def test_a_run_read_whole_is_what_the_word_by_word_reader_makes(text: str, separator: str,
                                                                  dialect: type[CurrentDialect]) -> None:
    if separator == ",":
        text = text.replace(" ", ",")
    names = _Reader(dialect).names  # (a legacy reader reads `B` as I until it has seen the file)
    codes = scan.PlainRuns(names, separator, "_" if separator == " " else "").read(text)
    if codes is None:
        return
    assert codes == careful_codes(text, separator, names)
    # ... and the text is what the printer writes for those integers, with that separator.
    written = {v: k for k, v in names.items()}
    idle = "_" if separator == " " else ""
    assert ActionText(written).read_row(codes, idle, separator) == text  # type: ignore[arg-type]


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(runs(), st.sampled_from([" ", ","]))
def test_what_a_run_learns_is_in_its_words(text: str, separator: str) -> None:
    """The largest numbers learned bound every run read whole (`TokenReader.within`) and give a
    CSV its microbatch count: each must be a word's own, even when the run is refused."""
    if separator == ",":
        text = text.replace(" ", ",")
    runs_ = scan.PlainRuns(KIND_BY_NAME, separator, "_" if separator == " " else "")
    runs_.read(text)
    words = text.split(separator)
    if runs_.top_micro >= 0:
        assert any(w.endswith(str(runs_.top_micro)) and w[: -len(str(runs_.top_micro))] in runs_.sk_of for w in words)
    if runs_.top_stage >= 0:
        assert any(w.startswith(str(runs_.top_stage)) for w in words)


def test_plain_runs_read_the_usual_rows_and_refuse_the_rest() -> None:
    runs_ = scan.PlainRuns(KIND_BY_NAME, " ", "_")
    assert runs_.read("0F0 0F1 1B0 12SEND_F3 2RECV_B10") == (
        [0 << KIND_BITS | Kind.F, 0 << KIND_BITS | Kind.F, 1 << KIND_BITS | Kind.B, 12 << KIND_BITS | Kind.SEND_F, 2 << KIND_BITS | Kind.RECV_B], [0, 1, 0, 3, 10])
    assert runs_.read("_ 0F0 _ _ 1B0 _") == ([None, 0 << KIND_BITS | Kind.F, None, None, 1 << KIND_BITS | Kind.B, None],
                                              [None, 0, None, None, 0, None])
    # Stage-only words have no microbatch: PyTorch ends GPipe's and 1F1B's rows with REDUCE_GRAD.
    assert runs_.read("1UNSHARD 0F0 _ 1REDUCE_GRAD 10RESHARD") == (
        [1 << KIND_BITS | Kind.UNSHARD, 0 << KIND_BITS | Kind.F, None, 1 << KIND_BITS | Kind.REDUCE_GRAD, 10 << KIND_BITS | Kind.RESHARD],
        [None, 0, None, None, None])
    for refused in ("0F0  0F1", "00F1", "0F01", "0F0 0FB1", "0F0\t0F1", "", "0F0 ", "_ 0F",
                    "0F _", "~F1", "0F0 ~F1", "_ ~F1", "__", "0F0 _0", "0UNSHARD0", "0F 0UNSHARD", "_ 0F 0UNSHARD",
                    "UNSHARD 0F0", "0UNSHARDF1", "0UNSHARD_", "00UNSHARD", "0REDUCE_GRAD1 0F0"):
        assert runs_.read(refused) is None, refused
    cells = scan.PlainRuns(KIND_BY_NAME, ",", "")
    assert cells.read(",0F0,,,1B0,") == ([None, 0 << KIND_BITS | Kind.F, None, None, 1 << KIND_BITS | Kind.B, None],
                                         [None, 0, None, None, 0, None])
    assert cells.read(",") == ([None, None], [None, None])
    assert cells.read("0F0,,0REDUCE_GRAD") == ([0 << KIND_BITS | Kind.F, None, 0 << KIND_BITS | Kind.REDUCE_GRAD], [0, None, None])
    for refused in ("0F0,0F", "0F,", ",~F1", "0F0, 0F1", "0REDUCE_GRAD0,0F0", "0F,0UNSHARD"):
        assert cells.read(refused) is None, refused


def careful_and_whole(text: str, steps_limit: int | None = None) -> tuple[Program | list[object], Program | list[object]]:
    def read(whole_runs: bool) -> Program | list[object]:
        try:
            return parse(text, "p.pps", steps_limit, whole_runs=whole_runs)
        except PpsError as err:
            return [d.as_json() for d in err.diagnostics]
    return read(False), read(True)


def source_of(program: Program) -> tuple[object, ...]:
    s = program.source
    assert s is not None
    return (s.path, s.text, s.header, s.rows, s.steps, s.options, s.format)


def same_program(careful: Program | list[object], whole: Program | list[object]) -> None:
    assert type(careful) is type(whole)
    if isinstance(careful, list):
        assert careful == whole  # the same diagnostics: codes, messages, lines, columns, widths
        return
    assert isinstance(whole, Program)
    assert whole == careful
    assert source_of(whole) == source_of(careful)  # every row's and run's position
    assert print_program(whole) == print_program(careful)
    assert print_program(whole, compact=True) == print_program(careful, compact=True)


lines = st.one_of(
    st.builds(lambda r, run, tail: f"rank {r}:{' ' if run else ''}{run}{tail}",
              st.integers(0, 3), runs(), st.sampled_from(["", " ", "\t", " # note", "\r", " \r", "\r\r"])),
    st.builds(lambda run: f"  {run}", runs()),  # a row's next line
    st.sampled_from(["rank 1:", "rank 9: 0F0", "rank  2 :0F1 0F2", "rank 0: 0F0 [0F1 0B0] 0B1", "# a comment", "",
                     "pipeline ranks=4 microbatches=5", "use 1f1b()", "costs F=1", "rank0: 0F0", " rank 1: 0F0"]),
)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.lists(lines, max_size=8), st.booleans(), st.booleans())
def test_a_file_read_with_runs_set_aside_is_the_file_read_carefully(body: list[str], header_first: bool,
                                                                      stages: bool) -> None:
    header = f"pipeline ranks=4 microbatches={MICROBATCHES}{f' stages={STAGES}' if stages else ''}"
    text = "\n".join([header, *body] if header_first else [*body, header]) + "\n"
    same_program(*careful_and_whole(text))


@pytest.mark.parametrize("text", [
    "pipeline ranks=2 microbatches=2\nrank 0: 0F0 0F1 0B0 0B1\nrank 1: 1F0 1B0 1F1 1B1\n",
    "rank 0: 0F0 0F1\npipeline ranks=1 microbatches=2\n",  # a row before the header: PPS010
    "pipeline ranks=1 microbatches=2\nuse 1f1b()\nrank 0: 0F0 0F1\n",  # PPS017 on the row
    "pipeline ranks=1 microbatches=2\nrank 0: 0F0 0F1\nrank 0: 0F0\n",  # a second row
    "pipeline ranks=1 microbatches=2\nrank 0: 0F0 0F7\n",  # out of bounds: PPS014 at its token
    "pipeline ranks=1 microbatches=2\nrank 0: 0F0 0F1\nrank 1 0F0\n",  # Lark's error on another line
    "pipeline ranks=1 microbatches=\nrank 0: 0F0 0F1\n",  # Lark's error before a set-aside row
    "pipeline ranks=2 microbatches=2\nrank 0: 0F0 0F1\n  0B0 0B1\nrank 1: 1F0 1B0 1F1 1B1 # c\n",
])
def test_set_aside_rows_give_the_careful_program_and_diagnostics(text: str) -> None:
    same_program(*careful_and_whole(text))


def test_a_written_out_row_is_read_whole_and_printed_from_its_own_text() -> None:
    text = "pipeline ranks=2 microbatches=2 stages=2 placement=loop\n\nrank 0: 0F0 0F1 0B0 0B1\nrank 1: 1F0 1B0 1F1 1B1\n"
    program = parse(text)
    rows = program.rows
    assert isinstance(rows, LazyRows)
    assert rows.texts == ["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"]
    assert print_program(program) == text
    # A row that is not one canonical run keeps no text: it is printed from its integers.
    other = parse("pipeline ranks=1 microbatches=2\nrank 0: 0F0 _ 0F01\n")
    assert isinstance(other.rows, LazyRows) and other.rows.texts == [None]
    assert print_program(other).endswith("rank 0: 0F0 _ 0F1\n")
    idle = parse("pipeline ranks=1 microbatches=2\nrank 0: _ 0F0 _ 0F1 _\n")
    assert isinstance(idle.rows, LazyRows) and idle.rows.texts == ["_ 0F0 _ 0F1 _"]


def test_a_csv_row_of_canonical_cells_is_read_whole_and_the_same() -> None:
    text = "0F0,0F1,0B0,0B1\n1F0,,1B0\n"
    program = read_csv(text, "s.csv")
    rows = program.rows
    assert isinstance(rows, LazyRows) and rows.codes[0] is not None and rows.codes[1] is not None
    assert [list(map(str, r)) for r in rows] == [["0F0", "0F1", "0B0", "0B1"], ["1F0", "_", "1B0"]]


def _limit_reached_after(steps: int, text: str) -> int:
    """The `steps_limit` under which `text` may hold exactly `steps` steps: a file may make that
    many beyond one for every WRITTEN_STEP_BYTES of its own bytes."""
    return steps - len(text) // limits.WRITTEN_STEP_BYTES


def test_a_set_aside_run_past_the_step_limit_is_underlined_whole() -> None:
    # What a file writes out never passes the limit alone: the range before the run makes 1,000
    # steps from 10 bytes, and the limit is reached 10 words into the run.
    run = " ".join(f"0F{m}" for m in range(20))
    text = f"pipeline ranks=2 microbatches=1000\nrank 1: 1B{{0..999}}\nrank 0: {run}\n"
    careful, whole = careful_and_whole(text, steps_limit=_limit_reached_after(1010, text))
    assert careful == whole
    assert isinstance(whole, list) and whole[0]["code"] == "PPS015"
    assert (whole[0]["line"], whole[0]["column"], whole[0]["end_column"]) == (3, 9, 9 + len(run))


# CSV rows with overlapped pairs as PyTorch writes DualPipeV's (`(0F1;1B0)OVERLAP_F_B`): the
# pair rows read in two whole runs give what the careful path makes of them, cell by cell, or
# the same diagnostics; and pairs written any other way go the careful way.
pair = st.builds(lambda a, b: f"({a};{b})OVERLAP_F_B", canonical, canonical)
odd_pair = st.sampled_from(["(0F1; 1B0)OVERLAP_F_B", "(0F1;1B0)", "(0F1;1B0;2W0)OVERLAP_F_B", "(0F1)OVERLAP_F_B",
                            "(0F{0..1};1B0)OVERLAP_F_B", "(01F1;1B0)OVERLAP_F_B", "(0F1;_)OVERLAP_F_B",
                            "(0F1;1B0)OVERLAP_F_BX", "(0UNSHARD;1B0)OVERLAP_F_B", "(;)OVERLAP_F_B", "("])
csv_cell = st.one_of(canonical, canonical, st.just(""), pair, pair, odd_pair)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(csv_cell, min_size=1, max_size=8), min_size=1, max_size=4),
       st.sampled_from([None, "current", "legacy"]))
def test_a_csv_row_with_pairs_read_whole_is_the_row_read_cell_by_cell(rows: list[list[str]], dialect: str | None) -> None:
    text = "".join(",".join(cells) + "\n" for cells in rows)

    def read(whole_runs: bool) -> Program | list[object]:
        try:
            return read_csv(text, "p.csv", dialect, whole_runs=whole_runs)
        except PpsError as err:
            return [d.as_json() for d in err.diagnostics]
    same_program(read(False), read(True))


def test_dualpipev_pairs_are_read_in_whole_runs() -> None:
    text = "0F0,0F1,(0F2;1B0)OVERLAP_F_B,,0B1\n1F0,1B0,(1F1;0B0)OVERLAP_F_B,1B1,0B2\n"
    reader = _Reader(CurrentDialect)
    steps = reader.paired_row(0, text.split("\n")[0])
    assert steps is not None and [str(s) for s in steps] == ["0F0", "0F1", "(0F2;1B0)", "_", "0B1"]
    assert reader.paired_row(0, "0F0,(0F1; 1B0)OVERLAP_F_B") is None  # a blank inside: cell by cell
    assert reader.paired_row(0, "0F0,(0F1;1SEND_B0)OVERLAP_F_B") is None  # not a compute action


# `.pps` rows of plain words and pairs, as `expand --comms` writes DualPipeV's: read before Lark
# in two whole runs (`rows.PairedRun`), they give the careful program, positions and
# diagnostics (a pair out of bounds or past the step limit is read again the careful way).
inbound = st.builds(lambda s, k, m: f"{s}{k.name}{'' if k.stage_only else m}",
                    st.integers(0, STAGES - 1), st.sampled_from(list(Kind)), st.integers(0, MICROBATCHES - 1))
compute = st.builds(lambda s, k, m: f"{s}{k.name}{m}", st.integers(0, STAGES - 1),
                    st.sampled_from([Kind.F, Kind.B, Kind.I, Kind.W]), st.integers(0, MICROBATCHES - 1))
pps_pair = st.one_of(st.builds(lambda a, b: f"({a};{b})", compute, compute),
                     st.builds(lambda a, b: f"({a};{b})", canonical, canonical))
odd_pps_pair = st.sampled_from(["(0F1; 1B0)", "(0F1;1B0;2W0)", "(0F1)", "(0F{0..1};1B{0..1})", "(01F1;1B0)",
                                "(0F1;_)", "(0F1;1B0)x", "(0UNSHARD;1B0)", "(;)", "(", "(0F1;1SEND_B0)", "(0F9;1B0)"])
clean_pair = st.builds(lambda a, b: f"({a};{b})", compute, compute)
# Mostly rows that are all in bounds (read before Lark), some with anything in them.
pps_row = st.one_of(st.lists(st.one_of(inbound, inbound, inbound, st.just("_"), clean_pair), min_size=1, max_size=30),
                    st.lists(st.one_of(inbound, inbound, canonical, st.just("_"), pps_pair, odd_pps_pair),
                             min_size=1, max_size=12))


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(pps_row, min_size=1, max_size=2), st.booleans(),
       st.sampled_from([None, 0, 4, 8]))
def test_a_pps_row_with_pairs_read_whole_is_the_row_read_carefully(rows: list[list[str]], stages: bool,
                                                                   over: int | None) -> None:
    shape = f" stages={STAGES} placement=loop" if stages else ""
    text = f"pipeline ranks={len(rows)} microbatches={MICROBATCHES}{shape}\n" + "".join(
        f"rank {r}: {' '.join(words)}\n" for r, words in enumerate(rows))
    # A rank counts as 16 steps against the limit: `over` steps past that, the rows may cross it.
    same_program(*careful_and_whole(text, steps_limit=None if over is None else 16 * len(rows) + over))


def test_a_pps_row_with_pairs_is_read_before_lark() -> None:
    from ppdsl.syntax.rows import PairedRun

    runs_ = scan.PlainRuns(KIND_BY_NAME, " ", "_")
    paired = PairedRun.read(9, "0F0 0SEND_F0 (0F1;3B0) _ 0B1 (0F2;3B1)", runs_)
    assert paired is not None and (paired.pairs, paired.offsets) == ([2, 5], [0, 4, 13, 23, 25, 29, 39])
    for refused in ("0F0 (0F1; 3B0)", "0F0  (0F1;3B0)", "(0F1;3SEND_B0)", "(0UNSHARD;3B0)", "(0F1;_)", "(0F1;3B0)x"):
        assert PairedRun.read(9, refused, runs_) is None, refused
    text = "pipeline ranks=2 microbatches=2 stages=4 placement=v\nrank 0: 0F0 (0F1;3B0) 3F1 3B1 0B0 0B1\n" \
           "rank 1: 1F0 2F0 2B0 1B0 1F1 2F1 2B1 1B1\n"
    careful, whole = careful_and_whole(text)
    same_program(careful, whole)
    # Past the step limit inside such a row: underlined where the careful way underlines it.
    words = " ".join(["0F0 0F1 (0F2;0B0) 0F3 0F4 (0B1;0B2) 0B3 0B4"] * 3)
    text = f"pipeline ranks=2 microbatches=1000\nrank 1: 1B{{0..999}}\nrank 0: {words}\n"
    careful, whole = careful_and_whole(text, steps_limit=_limit_reached_after(1017, text))
    same_program(careful, whole)
    assert isinstance(whole, list) and (whole[0]["code"], whole[0]["line"], whole[0]["column"]) == ("PPS015", 3, 89)
    # A number past the header's bounds inside such a row: told at its token, as carefully.
    careful, whole = careful_and_whole("pipeline ranks=1 microbatches=2\nrank 0: 0F0 (0F1;0B0) 0B1 (0F7;0B9)\n")
    same_program(careful, whole)
    assert isinstance(whole, list) and whole[0]["code"] == "PPS014"
