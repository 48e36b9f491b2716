"""Lowering and every generator give link orders equal to label orders: on each directed link
(sender rank, receiver rank) the k-th send is the one the k-th receive names, so the transport,
which matches by position, hands every receive what its label says. A property over random
valid programs, checked by a plain re-implementation of the rule (not by `encoding.Links`).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_lowering import random_program

from ppdsl.encoding import Encoded, Links
from ppdsl.ir import Kind, Program, actions_of
from ppdsl.lower import lower
from ppdsl.semantics import MODELS
from ppdsl.expansion import parse

GENERATORS = ["1f1b()", "gpipe()", "interleaved_1f1b(virtual=2)", "looped_bfs(virtual=2)", "zb1p()", "zbv()",
              "dualpipev()", "v_half()"]
_PEER = {Kind.SEND_F: (1, Kind.RECV_F), Kind.RECV_F: (-1, Kind.SEND_F), Kind.SEND_B: (-1, Kind.RECV_B),
         Kind.RECV_B: (1, Kind.SEND_B)}


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
    lowered = lower(program)
    assert_links_match(lowered)
    # Lowering hands its encoding over with the links in label order unscanned; a scan agrees.
    assert Links(Encoded(lowered)).meets is None
    for model in MODELS:
        assert_links_match(lower(program, fuse=True, comm_model=model))


@pytest.mark.parametrize("call", GENERATORS)
def test_every_generator_gives_link_order_equal_to_label_order(call: str) -> None:
    for ranks in (2, 4):
        program = parse(f"pipeline ranks={ranks} microbatches=8\nuse {call}\n")
        assert_links_match(lower(program))
        assert_links_match(lower(program, fuse=True, comm_model="grouped"))
