"""The data-parallel layout and where a stage's gradients are final: pure data, no framework."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppdsl.diagnostics import UsageError
from ppdsl.load import load_program
from ppdsl.runtime.interpreter import plan as P
from ppdsl.runtime.jobs.process_layout import Layout, batch_splits, check_world
from ppdsl.runtime.interpreter.preflight import prepare
from ppdsl.semantics import CommModel


def test_global_ranks_are_replica_major_as_fleets_topology() -> None:
    # CommunicateTopology(["data", "pipe", ...]) numbers ranks with "data" outside "pipe".
    places = [(lay.replica, lay.pipeline_rank) for lay in (Layout(2, 3, r) for r in range(6))]
    assert places == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    lay = Layout(2, 3, 3)
    assert lay.global_rank(0) == 2 and lay.global_rank(1, replica=2) == 5
    assert lay.data_parallel_groups() == [[0, 2, 4], [1, 3, 5]]
    assert lay.pair_groups([(0, 1)]) == [(0, 1), (2, 3), (4, 5)]


def test_a_replica_trains_on_its_own_rows() -> None:
    assert [Layout(4, 2, r).share(16) for r in (0, 3, 4, 7)] == [(0, 8), (0, 8), (8, 16), (8, 16)]


def test_bad_layouts_and_worlds_are_told_with_the_numbers() -> None:
    with pytest.raises(UsageError, match="replicas must be at least 1, not 0"):
        Layout(2, 0, 0)
    with pytest.raises(UsageError, match="global rank 4 is outside a layout of 2 pipeline ranks x 2 replicas"):
        Layout(2, 2, 4)
    with pytest.raises(UsageError, match=r"needs 2 x 2 = 4 processes, but 2 processes were started"):
        check_world(2, 2, 2)
    check_world(2, 2, 4)


def test_batch_splits_lists_the_degrees_that_fit() -> None:
    assert batch_splits(12, 4) == [1, 3]
    assert batch_splits(16, 4) == [1, 2, 4]


def _plan(text: str, rank: int, tmp_path: Path) -> P.Plan:
    f = tmp_path / "t.pps"
    f.write_text(text)
    return P.compile_rank(prepare(load_program(str(f)), CommModel.RENDEZVOUS), rank)


@pytest.mark.parametrize("generator", ["1f1b()", "zb1p()", "zbv()", "dualpipev()", "interleaved_1f1b(virtual=2)"])
def test_each_stage_is_reduced_after_its_last_backward_action(generator: str, tmp_path: Path) -> None:
    plan = _plan(f"pipeline ranks=2 microbatches=4\nuse {generator}\n", 0, tmp_path)
    ends = P.last_backward(plan)
    assert sorted(s for stages in ends.values() for s in stages) == list(plan.local_stages)
    for index, stages in ends.items():
        for s in stages:
            parts = [p for op in plan.ops[index + 1:] for p in (op.parts or (op,))]
            assert not any(p.stage == s and p.kind in P.BACKWARD for p in parts), (generator, s)
            here = plan.ops[index].parts or (plan.ops[index],)
            assert any(p.stage == s and p.kind in P.BACKWARD for p in here)


def test_the_index_looks_inside_overlapped_pairs_and_batches() -> None:
    def op(code: int, stage: int, mb: int) -> P.Op:
        return P.Op(code, stage, mb, -1, f"{stage}:{code}:{mb}")

    ops = (op(P.F, 0, 0), P.Op(P.OVERLAP, -1, -1, -1, "pair", (op(P.F, 0, 1), op(P.B, 0, 0))),
           op(P.F, 1, 0), op(P.I, 1, 0), P.Op(P.BATCH, -1, -1, -1, "batch", (op(P.W, 1, 0),)), op(P.F, 0, 2))
    plan = P.Plan(rank=0, ranks=1, stages=2, microbatches=3, local_stages=(0, 1), ops=ops, pairs=(), digest="",
                  training=True)
    assert P.last_backward(plan) == {1: (0,), 4: (1,)}


def test_an_inference_program_reduces_nothing(tmp_path: Path) -> None:
    assert P.last_backward(_plan("pipeline ranks=2 microbatches=2 mode=inference\nuse gpipe()\n", 0, tmp_path)) == {}
