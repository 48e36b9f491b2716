"""The table of action kinds (`ppdsl/kinds.py`) is the one statement of what a kind is: the
constants the hot loops use agree with it, every consumer covers exactly its kinds, and a row
added to a table is picked up by everything derived from it."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap

import pytest

from conftest import ROOT
from ppdsl import costs, encoding, layout, links, memory, kinds, proofs, semantics
from ppdsl.formats.torch_csv import CurrentDialect, LegacyDialect
from ppdsl.ir import KIND_BY_NAME, Action, Kind
from ppdsl.kinds import KINDS, PICTURES, SLOTS, SPARE, TABLE, KindRow, SlotRow, TableError, derive
from ppdsl.render import overview, terminal, timeline
from ppdsl.syntax import scan

F, I, W, B = Kind.F, Kind.I, Kind.W, Kind.B
R, OFFLOAD, RELOAD = Kind.R, Kind.OFFLOAD, Kind.RELOAD
SEND_F, RECV_F, SEND_B, RECV_B = Kind.SEND_F, Kind.RECV_F, Kind.SEND_B, Kind.RECV_B

NEXT = max(r.value for r in KINDS) + 1  # the value a new stage-only row takes


def _value(category: str) -> set[int]:
    return {r.value for r in KINDS if r.category == category}


# --------------------------------------------------------------------------------------------
# What the hot loops use agrees with the table


def test_kind_is_the_table_s_rows_in_value_order() -> None:
    assert [(k.name, k.value) for k in Kind] == sorted(((r.name, r.value) for r in KINDS), key=lambda p: p[1])
    for r in KINDS:
        k = Kind[r.name]
        assert k.row is r
        assert k.is_compute == (r.category == "compute")
        assert k.is_comm == (r.category == "comm")
        assert k.stage_only == (r.category == "stage")
        assert k.is_send == (r.category == "comm" and r.sends is not None)
        assert k.is_recv == (r.category == "comm" and r.sends is None)
        assert k.is_backward == r.backward


def test_the_layout_s_constants_are_derived_from_the_table() -> None:
    values = [r.value for r in KINDS]
    assert layout.KIND_MASK == (1 << layout.KIND_BITS) - 1 and layout.KIND_SPACE == 1 << layout.KIND_BITS
    assert layout.SLOT_MASK == (1 << layout.SLOT_BITS) - 1 and layout.SLOT_SPACE == 1 << layout.SLOT_BITS
    # The end of a row (all kind bits set) is no kind; NOTHING (the top slot) is no slot.
    assert semantics.END_OF_ROW == layout.KIND_MASK > max(values)
    assert layout.NOTHING == layout.SLOT_MASK > max(s.value for s in SLOTS)
    assert layout.kind_of(layout.INVALID_CODE) == layout.KIND_MASK
    # As wide as the table needs, and `kinds.SPARE` values more.
    assert layout.KIND_BITS == (max(values) + 1 + SPARE).bit_length()
    assert layout.SLOT_BITS == (len(SLOTS) + SPARE).bit_length()
    # Kind values: compute, then sends and receives, then stage-only, as the loops' bounds say.
    assert set(range(layout.COMPUTE_MAX + 1)) == _value("compute") == set(layout.COMPUTE_KINDS)
    # The sends and receives start where one bit marks them all (the values between are free).
    comm = _value("comm")
    assert comm == set(range(min(comm), layout.COMM_MAX + 1)) == set(layout.COMM_KINDS)
    assert layout.EXCHANGE_BIT and all(k & layout.EXCHANGE_BIT for k in comm)
    assert not any(k & layout.EXCHANGE_BIT for k in _value("compute"))
    assert all(v > layout.COMM_MAX for v in _value("stage"))
    # A receive has RECEIVE_BIT, a send not; EXCHANGE_BIT (when not 0) marks the sends and
    # receives among the kinds up to COMM_MAX.
    assert all(bool(k & encoding.RECEIVE_BIT) == Kind(k).is_recv for k in layout.COMM_KINDS)
    if layout.EXCHANGE_BIT:
        assert all(bool(k & layout.EXCHANGE_BIT) == Kind(k).is_comm for k in TABLE.by_value if k <= layout.COMM_MAX)
    assert {s.name: s.value for s in SLOTS} == {name: getattr(layout, name) for name in TABLE.slot_value}
    assert layout.SLOT_NAMES == {s.value: s.label for s in SLOTS}
    # The kinds as plain ints, and the table of Kind per value.
    assert (layout.F, layout.I, layout.W, layout.B) == (F, I, W, B)
    assert [layout.KIND_OF[v] for v in values] == [Kind(v) for v in values]
    assert len(layout.KIND_OF) == layout.KIND_SPACE


# The functions whose loops run once per action or per pair: they bind the layout's constants to
# locals, so no kind, slot or mask number may be written in them as a literal.
HOT = [semantics._Engine._loop, semantics._Engine._durations, proofs.pairs_meet, proofs._producers_beside_consumers,
       encoding.Needs.of, encoding.codes_from_reader, encoding.row_codes]
# Literals that are no number of the layout: a time of 0 or 1, "absent" (-1), a step of 1, and
# the ranks a byte holds (`pairs_meet`'s table of who waits where).
HARMLESS = {0, 1, -1, 256}


def _literals(fn: object) -> list[tuple[int, str]]:
    """(value, source) of every int literal that is an operand of a bit operation or a
    comparison, or an index step, in `fn`'s source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))  # type: ignore[arg-type]
    found: list[tuple[int, str]] = []

    def note(node: ast.AST, where: ast.AST) -> None:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            found.append((node.value, ast.unparse(where)))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            note(node.operand, where)

    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr, ast.RShift, ast.LShift)):
            note(node.left, node)
            note(node.right, node)
        elif isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                note(operand, node)
        elif isinstance(node, ast.Slice) and node.step is not None:
            note(node.step, node)
    return found


@pytest.mark.parametrize("fn", HOT, ids=lambda fn: fn.__qualname__)
def test_the_hot_loops_spell_no_number_of_the_layout(fn: object) -> None:
    assert [(v, text) for v, text in _literals(fn) if v not in HARMLESS] == []


def test_the_literal_finder_finds_what_the_loops_used_to_spell() -> None:
    def before(c: int, done: list[int]) -> bool:
        done[7::8] = [0]
        return c & 15 <= 3 or (c >> 4) << 3 > 7 or c == 15

    assert sorted(v for v, _ in _literals(before)) == [3, 3, 4, 7, 8, 15, 15]


# --------------------------------------------------------------------------------------------
# Every consumer covers exactly the table's kinds


def test_the_dependency_rule_is_the_table_s() -> None:
    # As it was written by hand before the table: the table states the same rule.
    # R, OFFLOAD and RELOAD wait for their forward; what they come before (the backward) is
    # their stage's row order, checked by `check.memory_actions`.
    assert encoding.LOCAL_NEEDS == ((F, B), (F, I), (I, W), (F, R), (F, OFFLOAD), (F, RELOAD))
    assert encoding.OWN_SLOT == {F: layout.F_DONE, I: layout.I_DONE}
    assert encoding.INPUT_FROM_STAGE == {F: (-1, layout.F_DONE), B: (1, layout.GRAD_DONE), I: (1, layout.GRAD_DONE)}
    assert encoding.INPUT_FROM_RECEIVE == {F: layout.RECV_F_DONE, B: layout.RECV_B_DONE, I: layout.RECV_B_DONE}
    assert encoding.SEND_NEEDS == {SEND_F: layout.F_DONE, SEND_B: layout.GRAD_DONE}
    assert encoding.COMPLETES == {SEND_F: layout.MSG_F_SENT, RECV_F: layout.RECV_F_DONE, SEND_B: layout.MSG_B_SENT,
                                  RECV_B: layout.RECV_B_DONE}
    assert encoding.PRODUCERS == {layout.F_DONE: (F,), layout.GRAD_DONE: (B, I), layout.I_DONE: (I,),
                                  layout.RECV_F_DONE: (RECV_F,), layout.RECV_B_DONE: (RECV_B,),
                                  layout.MSG_F_SENT: (SEND_F,), layout.MSG_B_SENT: (SEND_B,)}
    assert links.PEER_OF_KIND == {SEND_F: (1, RECV_F), RECV_F: (-1, SEND_F), SEND_B: (-1, RECV_B), RECV_B: (1, SEND_B)}
    # Every slot but NOTHING has a producer; every kind that completes something is a producer.
    assert all(encoding.PRODUCERS[s.value] for s in SLOTS)
    assert {k for ks in encoding.PRODUCERS.values() for k in ks} == {r.value for r in KINDS if r.completes}


def test_the_readers_and_the_csv_dialects_name_every_kind() -> None:
    names = {r.name for r in KINDS}
    assert set(KIND_BY_NAME) == names and all(KIND_BY_NAME[n].name == n for n in names)
    assert scan.KIND_LIST == ", ".join(k.name for k in Kind)
    for dialect, column in ((CurrentDialect, "current"), (LegacyDialect, "legacy")):
        assert set(dialect.write_names) == {k for k in Kind if k.row.in_csv} == set(Kind) - {R, OFFLOAD, RELOAD}
        assert {dialect.write_names[Kind[r.name]] for r in KINDS if r.in_csv} == {r.csv[column] for r in KINDS if r.in_csv}
        assert {v: k for k, v in dialect.read_names.items()} == dialect.write_names
    assert LegacyDialect.write_names[B] == "BW" and LegacyDialect.write_names[I] == "B"


def test_the_memory_signs_are_the_table_s() -> None:
    for split in (False, True):
        sign = memory.signs(split)
        assert len(sign) == layout.KIND_SPACE
        frees = "frees_split" if split else "frees"
        assert sign == [1 if v in {r.value for r in KINDS if r.memory in ("live", "remakes", "moves_in")} else
                        -1 if v in {r.value for r in KINDS if r.memory in (frees, "moves_out")} else 0
                        for v in range(layout.KIND_SPACE)]
    assert memory.signs(False)[:4] == [1, 0, 0, -1] and memory.signs(True)[:4] == [1, 0, -1, 0]
    assert [memory.signs(False)[k] for k in (R, OFFLOAD, RELOAD)] == [1, -1, 1]


def test_the_cost_keys_are_the_table_s() -> None:
    assert costs.COMPUTE_KINDS == ("F", "B", "I", "W", "R", "OFFLOAD", "RELOAD", "UNSHARD", "REDUCE_GRAD")
    assert set(costs.COMPUTE_KINDS) == {r.cost for r in KINDS if r.category != "comm" and r.cost}
    assert {r.cost for r in KINDS if r.category == "comm"} <= set(costs.GLOBAL_KEYS)
    # Of the stage-only kinds, the sharding collectives take time; freeing gathered weights none.
    assert [r.name for r in KINDS if r.category == "stage" and r.cost] == ["UNSHARD", "REDUCE_GRAD"]
    table = costs.CostModel((("F", 1.0), ("B", 3.0), ("UNSHARD", 2.0))).table(1)
    assert [table[0][Kind[key]] for key in costs.COMPUTE_KINDS] == [1.0, 3.0, 1.5, 1.5, 1.0, 0.0, 0.0, 2.0, 0.0]


def test_the_pictures_legend_and_colours_cover_every_kind() -> None:
    keys = [p.key for p in PICTURES]
    assert list(timeline.CATEGORIES) == list(timeline.COLOURS) == list(overview.GLYPHS) == keys
    assert set(terminal._LABELS) == set(keys)
    named = {r.picture for r in KINDS}
    # Every kind names a picture, and every picture not of a step of several actions is a kind's.
    assert named <= set(keys)
    assert named == {p.key for p in PICTURES if not p.step}
    for r in KINDS:
        action = Action(0, Kind[r.name], None if r.category == "stage" else 3)
        assert timeline.category(action) == r.picture
        short = r.short or r.name
        assert timeline._short_of(str(action)) == short + ("" if r.category == "stage" else "3")
    assert timeline.CATEGORIES["OTHER"] == "unshard / reshard / reduce" and timeline.COLOURS["F"] == "#4c78a8"


def test_the_language_reference_lists_every_kind() -> None:
    text = (ROOT / "docs" / "language.md").read_text(encoding="utf-8")
    section = text.split("## Rows and actions", 1)[1].split("\n#", 1)[0]
    listed = {name for line in section.splitlines() if line.startswith("| `")
              for name in re.findall(r"`([A-Z_]+)`", line.split("|")[1])}
    assert listed == {r.name for r in KINDS}


def test_every_kind_says_which_runtimes_run_it() -> None:
    assert all(r.runtimes <= kinds.RUNTIMES for r in KINDS)


# --------------------------------------------------------------------------------------------
# Adding a row is enough


ZERO_GRAD = KindRow("ZERO_GRAD", NEXT, "stage", short="ZG")


def test_a_new_stage_only_row_is_picked_up_by_every_derivation() -> None:
    more = derive((*KINDS, ZERO_GRAD))
    assert more.stage == (*TABLE.stage, ZERO_GRAD.value)
    assert (more.compute, more.comm, more.compute_max, more.comm_max) == (TABLE.compute, TABLE.comm, TABLE.compute_max,
                                                                          TABLE.comm_max)
    assert more.kind_bits >= TABLE.kind_bits and more.slot_bits == TABLE.slot_bits
    assert more.names["ZERO_GRAD"] == more.legacy_names["ZERO_GRAD"] == ZERO_GRAD.value
    assert more.signs(False)[ZERO_GRAD.value] == 0 and more.signs(False)[:len(TABLE.signs(False))] == TABLE.signs(False)
    assert more.producers == TABLE.producers and more.local_needs == TABLE.local_needs
    assert more.cost_keys == TABLE.cost_keys and ZERO_GRAD.picture in {p.key for p in PICTURES}
    assert more.by_value[ZERO_GRAD.value] is ZERO_GRAD
    # The table of the package is untouched.
    assert len(TABLE.rows) == len(KINDS) and "ZERO_GRAD" not in TABLE.names


@pytest.mark.parametrize("spare", [0, SPARE, 8])
def test_eight_more_kinds_and_slots_widen_the_layout_and_nothing_else(spare: int) -> None:
    extra = tuple(KindRow(f"EXTRA_{chr(65 + n)}", NEXT + n, "stage") for n in range(8))
    slots = (*SLOTS, *(SlotRow(f"EXTRA{n}_DONE", len(SLOTS) + n, f"X{n}") for n in range(8)))
    wider = derive((*KINDS, *extra), slots, spare)
    assert wider.kind_mask > max(r.value for r in wider.rows)  # the end of a row is still no kind
    assert wider.nothing > max(s.value for s in slots) and wider.nothing == wider.slot_mask
    assert (wider.kind_bits, wider.slot_bits) >= (TABLE.kind_bits, TABLE.slot_bits)
    # What the rows say is what they said: only the new ones and the widths differ.
    for name in ("compute", "comm", "sends", "receives", "compute_max", "comm_max", "receive_bit", "exchange_bit",
                 "local_needs", "own_slot", "input_from_stage", "input_from_receive", "send_needs", "completes",
                 "peer_of_kind", "cost_keys"):
        assert getattr(wider, name) == getattr(TABLE, name), name
    assert wider.stage == (*TABLE.stage, *(r.value for r in extra))
    assert {k: v for k, v in wider.producers.items() if v} == {k: v for k, v in TABLE.producers.items()}
    # With eight values to spare, the layout of today's table holds eight more of each as it is.
    roomy = derive(KINDS, SLOTS, 8)
    assert roomy.kind_mask - NEXT >= 8 and roomy.nothing - len(SLOTS) >= 8


def test_a_new_compute_row_takes_a_free_value_below_the_sends() -> None:
    # One more compute kind (a prefetch of the input, a sketch) takes the value left free below
    # the sends and receives, which keep their values and the bit that marks them.
    prefetch = KindRow("PREFETCH", len(TABLE.compute), "compute", local="F_DONE", cost="PREFETCH")
    more = derive((*KINDS, prefetch))
    assert more.comm == TABLE.comm and more.exchange_bit == TABLE.exchange_bit and more.kind_bits == TABLE.kind_bits


def test_sends_and_receives_off_their_aligned_start_are_refused() -> None:
    # Moved up by one, the sends' values turn odd and no bit marks the four: refused.
    rows = [r if r.category == "compute" else r._replace(value=r.value + 1) for r in KINDS]
    with pytest.raises(TableError, match="the sends and receives, which start at 8"):
        derive(rows)


@pytest.mark.parametrize(("rows", "message"), [
    ((*KINDS, KindRow("X", NEXT + 1, "stage")), "no gap"),
    ((*KINDS, KindRow("F", NEXT, "stage")), "share a value or a name"),
    ((KindRow("U", 0, "stage"), KINDS[0]._replace(value=1)), "compute, then"),
    ((*KINDS, KindRow("X", NEXT, "stage", local="F_DONE")), "only a compute waits"),
    ((*KINDS, KindRow("X", NEXT, "stage", completes=("NOPE",))), "names no slot"),
    ((*KINDS, KindRow("ZERO-GRAD", NEXT, "stage")), "upper-case letters"),
])
def test_a_table_the_layout_cannot_take_is_refused(rows: tuple[KindRow, ...], message: str) -> None:
    with pytest.raises(TableError, match=message):
        derive(rows)
