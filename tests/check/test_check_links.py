"""PPS212 and the matching rule: on each directed link the k-th receive takes the k-th send.

- The issue's two-rank example (plain and as batches) is PPS212 alone under every model,
  with both positions named and the reorder suggested; the engine runs it to the end.
- (tests/lower/test_link_order.py: lowering and every generator give link order = label order.)
- Every swap of two adjacent receives from the same peer in a lowered program is PPS212 under
  all three models and never a deadlock, including F/B pairs sharing a link in V placements.
"""

from __future__ import annotations

import re

import pytest
from conftest import ROOT

from ppdsl.check import check
from ppdsl.ir import Action, Batch, Kind, Program
from ppdsl.encoding import Encoded, Links, in_label_order
from ppdsl.lower import lower
from ppdsl.semantics import MODELS, execute
from ppdsl.expansion import parse

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
    # A failing example, so fenced as text (the page's `pps` examples all lint clean).
    (text,) = [t for t in re.findall(r"^```text\n(.*?)^```", page, flags=re.S | re.M) if "0SEND_F1 0SEND_F0" in t]
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


@pytest.mark.slow
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


def test_the_position_table_shortcut_decides_as_the_scan_does() -> None:
    """`Links` decides "every link in label order" from the position table when it can; on
    lowered programs and on every adjacent receive swap it says what reading the rows says."""
    decided = 0
    for call in GENERATORS:
        lowered = lower(parse(f"pipeline ranks=3 microbatches=6\nuse {call}\n"))
        for program in [lowered] + [m for m, _, _ in adjacent_receive_swaps(lowered)]:
            enc = Encoded(program)
            scanned = Links(enc, scan=True).meets is None
            assert in_label_order(enc) == scanned, call
            assert (Links(enc).meets is None) == scanned
            decided += 1
    assert decided > 100
