"""The rules of `UNSHARD`, `RESHARD` and `REDUCE_GRAD` (ppdsl/check/sharding.py): a sharded
stage computes on gathered weights, and reduces its gradients once they are whole."""

from __future__ import annotations

import pytest

from ppdsl.check import check, lower_checked
from ppdsl.expansion import parse
from ppdsl.formats.torch_csv import read_csv, write_csv

H1 = "pipeline ranks=1 microbatches=2\n"


def codes(text: str) -> list[tuple[str, int | None, int | None]]:
    return [(d.code, d.rank, d.step) for d in check(parse(text, "p.pps"))]


@pytest.mark.parametrize("row", [
    "0UNSHARD 0F0 0F1 0B0 0B1 0RESHARD 0REDUCE_GRAD",
    "0UNSHARD 0F0 0F1 0RESHARD 0UNSHARD 0B0 0B1 0RESHARD 0REDUCE_GRAD",  # gathered twice in the step
    "0UNSHARD 0F0 0F1 0I0 0I1 0W0 0W1 0REDUCE_GRAD 0RESHARD",  # split backward: after the last W
    "0F0 0F1 0B0 0B1 0REDUCE_GRAD",  # not sharded: only the reduction's place is checked
    "0F0 0F1 0B0 0B1",
])
def test_sharded_stages_in_place_lint_clean(row: str) -> None:
    assert codes(H1 + f"rank 0: {row}\n") == []


@pytest.mark.parametrize(("row", "found"), [
    ("0F0 0UNSHARD 0F1 0B0 0B1", [("PPS112", 0, 0)]),  # before the stage's UNSHARD
    ("0UNSHARD 0F0 0F1 0RESHARD 0B0 0B1", [("PPS112", 0, 4)]),  # after its RESHARD: told once
    ("0RESHARD 0UNSHARD 0F0 0F1 0B0 0B1", [("PPS112", 0, 0)]),  # frees what nothing gathered
    ("0UNSHARD 0F0 0F1 0R0 0RESHARD 0B0 0B1", [("PPS112", 0, 5)]),  # a recompute counts as compute too
    ("0F0 0F1 0B0 0REDUCE_GRAD 0B1", [("PPS113", 0, 3)]),
    ("0F0 0F1 0I0 0I1 0W0 0REDUCE_GRAD 0W1", [("PPS113", 0, 5)]),  # the last W completes them
])
def test_each_rule_is_told_at_its_action(row: str, found: list[tuple[str, int, int]]) -> None:
    assert codes(H1 + f"rank 0: {row}\n") == found


def test_the_messages_name_the_actions_and_the_fix() -> None:
    (d,) = check(parse(H1 + "rank 0: 0UNSHARD 0F0 0F1 0RESHARD 0B0 0B1\n", "p.pps"))
    assert d.message == "`0B0` at step 4 computes with stage 0's weights after `0RESHARD` freed them"
    assert d.help == "move `0RESHARD` after `0B0`, or add `0UNSHARD` before `0B0`"
    assert (d.line, d.column) == (2, 35)
    (d,) = check(parse(H1 + "rank 0: 0F0 0F1 0B0 0REDUCE_GRAD 0B1\n", "p.pps"))
    assert d.message == "`0REDUCE_GRAD` at step 3 reduces stage 0's gradients before `0B1` at step 4 adds to them"
    assert d.help == "move `0REDUCE_GRAD` after `0B1`"


def test_each_stage_of_a_rank_is_judged_on_its_own() -> None:
    head = "pipeline ranks=1 microbatches=1 stages=2\n"
    # Stage 1 is sharded only if it has an UNSHARD: here it has none.
    assert codes(head + "rank 0: 0UNSHARD 0F0 1F0 1B0 0B0 0RESHARD\n") == []
    assert codes(head + "rank 0: 0UNSHARD 0F0 1UNSHARD 1F0 1RESHARD 1B0 0B0 0RESHARD\n") == [("PPS112", 0, 5)]


def test_lowering_keeps_them_and_a_torch_csv_round_trips_them() -> None:
    text = ("pipeline ranks=2 microbatches=2\n"
            "rank 0: 0UNSHARD 0F0 0F1 0B0 0B1 0RESHARD 0REDUCE_GRAD\n"
            "rank 1: 1UNSHARD 1F0 1B0 1F1 1B1 1RESHARD 1REDUCE_GRAD\n")
    lowered = lower_checked(parse(text, "p.pps"))
    assert check(lowered) == []
    csv, _ = write_csv(lowered)
    assert check(read_csv(csv, "p.csv")) == []
    moved = read_csv(csv.replace("0REDUCE_GRAD", "0XX").replace("0B1", "0REDUCE_GRAD").replace("0XX", "0B1"), "p.csv")
    # `0B1` and `0REDUCE_GRAD` swapped: the reduction comes too early, and `0B1` after `0RESHARD`.
    assert sorted(d.code for d in check(moved)) == ["PPS112", "PPS113"]
