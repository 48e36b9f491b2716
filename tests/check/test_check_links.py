"""PPS212 and the matching rule: on each directed link the k-th receive takes the k-th send.

- The issue's two-rank example (plain and as batches) is PPS212 alone under every model,
  with both positions named and the reorder suggested; the engine runs it to the end.
- Lowering and every generator give link orders equal to label orders (a property over random
  valid programs, checked by a plain re-implementation of the rule, not by `Links`).
- Every swap of two adjacent receives from the same peer in a lowered program is PPS212 under
  all three models and never a deadlock, including F/B pairs sharing a link in V placements.
"""

from __future__ import annotations

import re

import pytest
from conftest import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st
from test_check_lowering import random_program

from ppdsl.check import check
from ppdsl.ir import Action, Batch, Kind, Program, actions_of
from ppdsl.lower import lower
from ppdsl.semantics import MODELS, execute
from ppdsl.syntax.parser import parse

OUT_OF_ORDER = """pipeline ranks=2 microbatches=2
rank 0: 0F0 0F1 0SEND_F1 0SEND_F0 0RECV_B0 0B0 0RECV_B1 0B1
rank 1: 1RECV_F0 1RECV_F1 1F0 1B0 1SEND_B0 1F1 1B1 1SEND_B1
"""
OUT_OF_ORDER_BATCHES = """pipeline ranks=2 microbatches=2
rank 0: 0F0 0F1 <0SEND_F1 0SEND_F0> 0RECV_B0 0B0 0RECV_B1 0B1
rank 1: <1RECV_F0 1RECV_F1> 1F0 1B0 1SEND_B0 1F1 1B1 1SEND_B1
"""
GENERATORS = ["1f1b()", "gpipe()", "interleaved_1f1b(virtual=2)", "looped_bfs(virtual=2)", "zb1p()", "zbv()",
              "dualpipev()", "v_half()"]
_PEER = {Kind.SEND_F: (1, Kind.RECV_F), Kind.RECV_F: (-1, Kind.SEND_F), Kind.SEND_B: (-1, Kind.RECV_B),
         Kind.RECV_B: (1, Kind.SEND_B)}


def codes(program: Program, model: str) -> list[str]:
    return [d.code for d in check(program, model)]


@pytest.mark.parametrize("text", [OUT_OF_ORDER, OUT_OF_ORDER_BATCHES], ids=["plain", "batches"])
def test_the_issue_example_is_pps212_under_every_model(text: str) -> None:
    program = parse(text, "swap.pps")
    for model in MODELS:
        found = check(program, model)
        assert [d.code for d in found] == ["PPS212"], model
        d = found[0]
        assert (d.rank, d.step) == (1, 0)
        assert "link from rank 0 to rank 1" in d.message
        assert "the 1st message rank 0 sends is `0SEND_F1` (swap.pps:2:" in d.message
        assert "the 1st receive rank 1 posts is `1RECV_F0` (swap.pps:3:9)" in d.message
        assert "microbatch 0 of stage 1 would be handed the activation of microbatch 1" in d.message
        assert d.help is not None and "move `0SEND_F0` before `0SEND_F1` on rank 0" in d.help
        assert "`1RECV_F1` before `1RECV_F0` on rank 1" in d.help
        # The engine pairs by position too: the run completes (with the wrong data).
        assert execute(program, model).completed, model


def test_the_language_page_example_is_pps212() -> None:
    page = (ROOT / "docs" / "language.md").read_text(encoding="utf-8")
    (text,) = [t for t in re.findall(r"^```pps\n(.*?)^```", page, flags=re.S | re.M) if "0SEND_F1 0SEND_F0" in t]
    assert codes(parse(text), "rendezvous") == ["PPS212"]


def test_a_true_deadlock_stays_pps210_beside_the_order_error() -> None:
    # The forward link is out of order, and both ranks send before they receive backward:
    # matched by position it still hangs under rendezvous (a real cycle), not under buffered.
    text = """pipeline ranks=2 microbatches=2
rank 0: 0F0 0F1 0SEND_F1 0SEND_F0 0RECV_B0 0B0 0RECV_B1 0B1
rank 1: 1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1
"""
    program = parse(text)
    assert codes(program, "buffered") == ["PPS212"]
    found = check(program, "rendezvous")
    assert sorted(d.code for d in found) == ["PPS210", "PPS212"]
    deadlock = next(d for d in found if d.code == "PPS210")
    # The cycle that happens: rank 0's second send, `0SEND_F0`, is the one `1RECV_F1` takes.
    assert "rank 0 waits at step 3 `0SEND_F0` for rank 1, which waits at step 3 `1SEND_B0` for rank 0" in deadlock.message
    assert "rank 0 `0SEND_F0` needs `1RECV_F1` to be posted" in deadlock.notes


def link_orders(program: Program) -> dict[tuple[int, int], tuple[list[tuple[int, Kind, int | None]], list[tuple[int, Kind, int | None]]]]:
    """(src, dst) -> (the labelled peers of the sends in src's order, the receives in dst's order)."""
    placement = program.placement
    out: dict[tuple[int, int], tuple[list[tuple[int, Kind, int | None]], list[tuple[int, Kind, int | None]]]] = {}
    for rank, row in enumerate(program.rows):
        for a in (a for step in row for a in actions_of(step) if a.kind.is_comm):
            step_to, peer_kind = _PEER[a.kind]
            other = placement[a.stage + step_to]
            if a.kind.is_send:
                out.setdefault((rank, other), ([], []))[0].append((a.stage + step_to, peer_kind, a.microbatch))
            else:
                out.setdefault((other, rank), ([], []))[1].append((a.stage, a.kind, a.microbatch))
    return out


def assert_links_match(program: Program) -> None:
    for link, (sent, got) in link_orders(program).items():
        assert sent == got, link


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), ranks=st.integers(1, 4), stages=st.integers(1, 6),
       microbatches=st.integers(1, 4), split=st.booleans())
def test_lowering_gives_link_order_equal_to_label_order(seed: int, ranks: int, stages: int, microbatches: int,
                                                        split: bool) -> None:
    program = random_program(seed, ranks, stages, microbatches, split)
    assert_links_match(lower(program))
    for model in MODELS:
        assert_links_match(lower(program, fuse=True, comm_model=model))


@pytest.mark.parametrize("call", GENERATORS)
def test_every_generator_gives_link_order_equal_to_label_order(call: str) -> None:
    for ranks in (2, 4):
        program = parse(f"pipeline ranks={ranks} microbatches=8\nuse {call}\n")
        assert_links_match(lower(program))
        assert_links_match(lower(program, fuse=True, comm_model="grouped"))


def adjacent_receive_swaps(program: Program) -> list[tuple[Program, tuple[Kind, Kind], bool]]:
    """Every program made by swapping two receives that are next to each other on their link
    (consecutive receives from one peer, as steps or members of batches): the mutant, the two
    kinds, and whether a compute sits between them."""
    placement = program.placement

    def source(a: Action) -> int:
        return placement[a.stage + _PEER[a.kind][0]]

    out: list[tuple[Program, tuple[Kind, Kind], bool]] = []
    for r, row in enumerate(program.rows):
        # Per peer: (step, member or -1, action) of the last receive, and whether a compute came since.
        last: dict[int, tuple[int, int, Action]] = {}
        computed: dict[int, bool] = {}
        for j, stp in enumerate(row):
            if not isinstance(stp, Batch) and not (isinstance(stp, Action) and stp.kind.is_comm):
                computed = dict.fromkeys(computed, True)
                continue
            members = list(enumerate(stp.parts)) if isinstance(stp, Batch) else [(-1, stp)]
            for m, a in members:
                if not a.kind.is_recv:
                    continue
                peer = source(a)
                prev, across = last.get(peer), computed.get(peer, False)
                last[peer], computed[peer] = (j, m, a), False
                if prev is None:
                    continue
                rows = [list(rr) for rr in program.rows]
                for jj, mm, put in ((prev[0], prev[1], a), (j, m, prev[2])):
                    if mm < 0:
                        rows[r][jj] = put
                    else:
                        batch = rows[r][jj]
                        assert isinstance(batch, Batch)
                        parts = list(batch.parts)
                        parts[mm] = put
                        rows[r][jj] = Batch(tuple(parts))
                out.append((program.evolve(rows=tuple(map(tuple, rows)), source=None), (prev[2].kind, a.kind), across))
    return out


def test_every_adjacent_receive_swap_is_pps212_never_a_deadlock() -> None:
    seen = 0
    mixed = 0  # swaps of a forward and a backward receive sharing a link (V placements)
    alone = 0  # swaps with no compute between: the order is the only fault
    for call in GENERATORS:
        for ranks in (2, 3):
            base = parse(f"pipeline ranks={ranks} microbatches=6\nuse {call}\n")
            for program in (lower(base), lower(base, fuse=True, comm_model="grouped")):
                for mutant, kinds, across in adjacent_receive_swaps(program):
                    seen += 1
                    mixed += kinds[0] != kinds[1]
                    alone += not across
                    for model in MODELS:
                        found = codes(mutant, model)
                        assert "PPS212" in found and not {"PPS210", "PPS211"} & set(found), (call, ranks, model, found)
                        if not across:
                            assert found == ["PPS212"], (call, ranks, model, found)
                        else:  # and PPS206 when the compute between is the one a receive feeds
                            assert set(found) <= {"PPS206", "PPS212"}, (call, ranks, model, found)
    assert seen >= 500, seen
    assert mixed >= 10 and alone >= 10, (mixed, alone)
