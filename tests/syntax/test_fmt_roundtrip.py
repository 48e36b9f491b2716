"""`ppdsl fmt` and the printer: canonical, idempotent, meaning-preserving (with hypothesis)."""

from __future__ import annotations

import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ppdsl.diagnostics import PpsError
from ppdsl.ir import IDLE, Action, Batch, Kind, Overlap, Program, Step
from ppdsl.syntax.formatter import format_text
from ppdsl.expansion import parse
from ppdsl.syntax.printer import print_program

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

MESSY = """\
# A hand-written schedule, untidy on purpose.


pipeline   microbatches=04 placement=loop ranks=2   stages=2   # header comment
costs F=1   B=2.0
rank 1:   _\t1F{ 0 .. 1 }   1B{0..1}
rank 0:   # first line holds only a comment
      0F0   0F1
# between continuation lines



     (0F0;1B1)OVERLAP_F_B   <0SEND_F0    0RECV_B0>
      [0F{2..3}  0B{0..1}]     # trailing
# the end
"""

TIDY = """\
# A hand-written schedule, untidy on purpose.

pipeline ranks=2 microbatches=4 stages=2 placement=loop  # header comment
costs F=1 B=2.0
rank 1: _ 1F{0..1} 1B{0..1}
rank 0:  # first line holds only a comment
        0F0 0F1
        # between continuation lines

        (0F0;1B1) <0SEND_F0 0RECV_B0>
        [0F{2..3} 0B{0..1}]  # trailing
# the end
"""


def test_messy_file_formats_to_the_canonical_text() -> None:
    assert format_text(MESSY) == TIDY
    assert format_text(TIDY) == TIDY
    assert parse(TIDY) == parse(MESSY)


def test_generator_line_and_crlf() -> None:
    text = "pipeline ranks=4  microbatches=8\r\nuse   1f1b( )   # gen\r\n"
    assert format_text(text) == "pipeline ranks=4 microbatches=8\nuse 1f1b()  # gen\n"
    text = "pipeline ranks=4 microbatches=8\nuse interleaved_1f1b(virtual = 2)\n"
    assert format_text(text) == "pipeline ranks=4 microbatches=8\nuse interleaved_1f1b(virtual=2)\n"


def test_format_refuses_invalid_text() -> None:
    with pytest.raises(PpsError):
        format_text("pipeline ranks=1 microbatches=1\nrank 0: 0F5\n")


# ---- (a) any program prints to text that parses back to it -------------------------------

@st.composite
def programs(draw: st.DrawFn) -> Program:
    ranks = draw(st.integers(1, 4))
    stages = draw(st.integers(1, 6))
    microbatches = draw(st.integers(1, 6))
    placement = tuple(draw(st.lists(st.integers(0, ranks - 1), min_size=stages, max_size=stages)))
    stage, micro = st.integers(0, stages - 1), st.integers(0, microbatches - 1)

    def of(kinds: list[Kind]) -> st.SearchStrategy[Action]:
        return st.builds(lambda s, k, m: Action(s, k, None if k.stage_only else m), stage, st.sampled_from(kinds), micro)

    compute = of([k for k in Kind if k.is_compute])
    comm = of([k for k in Kind if k.is_comm])
    step: st.SearchStrategy[Step] = st.one_of(
        of(list(Kind)), st.just(IDLE),
        st.builds(lambda a, b: Overlap((a, b)), compute, compute),
        st.builds(lambda parts: Batch(tuple(parts)), st.lists(comm, min_size=1, max_size=3)),
    )
    rows = tuple(tuple(draw(st.lists(step, max_size=10))) for _ in range(ranks))
    memory = draw(st.none() | st.floats(min_value=1e-9, max_value=1e30, allow_nan=False, allow_infinity=False))
    names = st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,6}", fullmatch=True)
    costs = draw(st.dictionaries(names, st.floats(min_value=0, max_value=1e20, allow_nan=False), max_size=4))
    return Program(ranks=ranks, stages=stages, microbatches=microbatches, placement=placement, rows=rows,
                   mode=draw(st.sampled_from(["train", "inference"])), memory_limit=memory,
                   costs=tuple(costs.items()))


@pytest.mark.slow
@SETTINGS
@given(programs())
def test_printed_programs_parse_back_equal(program: Program) -> None:
    text = print_program(program, comment="generated\nby hypothesis")
    assert parse(text) == program
    assert format_text(text) == text  # the printer's output is already canonical


# ---- (b) any well-formed text: fmt keeps its meaning and is idempotent ------------------------

STAGES, MICROBATCHES = 4, 6
blank = st.sampled_from([" ", "  ", "\t", " \t "])
comment = st.builds(lambda s: "# " + s, st.text(alphabet=string.ascii_letters + " #{}[]()<>;,_", max_size=12))


def _range(n: int, limit: int) -> st.SearchStrategy[str]:
    """`{a..b}` with exactly n values, ascending or descending, inside 0..limit-1."""
    return st.integers(0, limit - n).flatmap(
        lambda a: st.sampled_from([f"{{{a}..{a + n - 1}}}", f"{{{a + n - 1}..{a}}}", f"{{ {a} .. {a + n - 1} }}"]))


def _token(kinds: str, n: int) -> st.SearchStrategy[str]:
    """A token that expands to n actions: plain (n == 1) or with one or two ranges."""
    kind = st.sampled_from(kinds.split())
    stage, micro = st.integers(0, STAGES - 1).map(str), st.integers(0, MICROBATCHES - 1).map(str)
    if n == 1:
        return st.builds(lambda s, k, m: s + k + m, stage, kind, micro | micro.map(lambda x: "0" + x))
    return st.one_of(
        st.builds(lambda s, k, m: s + k + m, stage, kind, _range(n, MICROBATCHES)),
        st.builds(lambda s, k, m: s + k + m, _range(n, STAGES), kind, micro),
        st.builds(lambda s, k, m: s + k + m, _range(n, STAGES), kind, _range(n, MICROBATCHES)),
    )


def _overlap(n: int) -> st.SearchStrategy[str]:
    return st.builds(lambda a, b, sp, suffix: f"({a};{sp}{b}){suffix}", _token("F", n), _token("B I W", n),
                     st.sampled_from(["", " "]), st.sampled_from(["", "OVERLAP_F_B"]))


item = st.one_of(
    _token("F B I W SEND_F RECV_B", 1), st.just("_"), st.just("2UNSHARD"),
    st.integers(1, 4).flatmap(lambda n: _token("F B W", n)),
    st.integers(1, 3).flatmap(_overlap),
    st.lists(_token("SEND_F RECV_F SEND_B RECV_B", 1), min_size=1, max_size=3).map(lambda ws: "<" + " ".join(ws) + ">"),
    st.integers(1, 3).flatmap(lambda n: st.lists(_token("F B I", n) | _overlap(n), min_size=1, max_size=3)
                              .map(lambda ms: "[" + " ".join(ms) + "]")),
)


@st.composite
def sources(draw: st.DrawFn) -> str:
    out: list[str] = []
    for _ in range(draw(st.integers(0, 2))):
        out.append(draw(comment | st.just("")))
    options = ["ranks=3", f"microbatches={MICROBATCHES}", f"stages={STAGES}", "placement=loop"]
    options = draw(st.permutations(options))
    out.append("pipeline" + "".join(draw(blank) + o for o in options) + draw(st.just("") | blank.map(lambda b: b + "# h")))
    if draw(st.booleans()):
        out.append("costs F=1 B=2.5")
    for rank in draw(st.permutations([0, 1, 2])):
        if draw(st.integers(0, 4)) == 0:
            continue
        lines = draw(st.lists(st.lists(item, max_size=5), min_size=1, max_size=4))
        first = True
        for items in lines:
            head = f"rank{draw(blank)}{rank}:" if first else ""
            body = draw(blank).join(items)
            if not first and not items:
                continue  # a continuation line needs at least one item
            if not first:
                out.extend(draw(st.lists(comment | st.just(""), max_size=2)))
            tail = draw(st.just("") | comment.map(lambda c: "  " + c))
            out.append(head + draw(blank) + body + tail)
            first = False
    return "\n".join(out) + draw(st.sampled_from(["\n", "", "\n\n"]))


@pytest.mark.slow
@SETTINGS
@given(sources())
def test_fmt_keeps_meaning_and_is_idempotent(text: str) -> None:
    program = parse(text)
    once = format_text(text)
    assert parse(once) == program
    assert format_text(once) == once
    # Comments survive, in order.
    assert [c.strip() for c in _comments(once)] == [c.strip() for c in _comments(text)]


def _comments(text: str) -> list[str]:
    return [line[line.index("#"):].rstrip() for line in text.splitlines() if "#" in line]


# ---- (c) arbitrary text never escapes as anything but a diagnostic ---------------------------

junk = st.text(alphabet="pipelinerankus =:0123456789FBIWSEND_RECV{}.[]()<>;,#\n\t\r\x00é", max_size=120)


@pytest.mark.slow
@SETTINGS
@given(st.one_of(junk, sources().map(lambda t: t[: len(t) // 2]), st.builds(lambda a, b: a + b, sources(), junk)))
def test_any_text_parses_or_gives_located_diagnostics(text: str) -> None:
    try:
        program = parse(text, "fuzz.pps")
    except PpsError as exc:
        d = exc.diagnostics[0]
        assert d.path == "fuzz.pps" and d.line >= 1 and d.column >= 1
        assert d.line <= text.count("\n") + 2
        return
    assert format_text(text) is not None and parse(print_program(program)) == program
