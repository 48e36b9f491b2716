"""PipeOffload's selective offload: interleaved 1F1B with the first `chunks` chunks of each rank
offloaded; the memory figures at unit costs that the generator's docstring states."""

from __future__ import annotations

import pytest

from ppdsl.check import check
from ppdsl.expansion import parse
from ppdsl.generators import registry
from ppdsl.ir import Kind
from ppdsl.simulate import simulate


def program(ranks: int, microbatches: int, chunks: int, virtual: int = 2) -> object:
    return parse(f"pipeline ranks={ranks} microbatches={microbatches}\n"
                 f"use pipeoffload(virtual={virtual}, chunks={chunks})\n", "p.pps")


@pytest.mark.parametrize("chunks, peak", [(0, 47.0), (1, 18.0), (2, 2.0)])
def test_peak_chunk_activations_at_16_ranks(chunks: int, peak: float) -> None:
    # In microbatches of one chunk's activations (the unit counts a chunk 1/v = 1/2): 47 is
    # interleaved 1F1B's (v+1)p - 1; chunk 0 offloaded leaves p + 2; both, 2 whatever p.
    prog = program(16, 64, chunks)
    assert [d for d in check(prog) if d.is_error] == []  # type: ignore[arg-type]
    sim = simulate(prog, "F=1,B=2")  # type: ignore[arg-type]
    assert max(sim.peak_memory) * 2 == peak
    # Free copies on a copy lane: the same time as interleaved 1F1B.
    assert sim.makespan == simulate(parse("pipeline ranks=16 microbatches=64\nuse interleaved_1f1b(virtual=2)\n"),
                                    "F=1,B=2").makespan


@pytest.mark.parametrize("ranks", [4, 8, 32])
def test_full_offload_holds_two_chunk_microbatches_whatever_the_ranks(ranks: int) -> None:
    assert max(simulate(program(ranks, 4 * ranks, 2)).peak_memory) * 2 == 2.0  # type: ignore[arg-type]


def test_offloads_follow_forwards_and_reloads_lead_backwards_by_one_action() -> None:
    prog = program(2, 4, 1)
    for row in prog.rows:  # type: ignore[attr-defined]
        for i, a in enumerate(row):
            if a.kind is Kind.OFFLOAD:
                assert row[i - 1].kind is Kind.F and (row[i - 1].stage, row[i - 1].microbatch) == (a.stage, a.microbatch)
                assert a.stage < 2  # chunk 0 only: stages 0 and 1 at 2 ranks
            if a.kind is Kind.RELOAD:
                back = next(j for j in range(i, len(row)) if row[j].kind is Kind.B
                            and (row[j].stage, row[j].microbatch) == (a.stage, a.microbatch))
                computes = [b for b in row[i + 1:back] if b.kind not in (Kind.OFFLOAD, Kind.RELOAD)]
                assert len(computes) <= 1  # right before it, or one compute ahead


def test_arguments_are_checked() -> None:
    with pytest.raises(registry.GeneratorError, match="a rank holds 2 chunks"):
        registry.expand("pipeoffload", 2, 4, {"virtual": 2, "chunks": 3})


@pytest.mark.parametrize("extra, kind", [("offload=all", Kind.OFFLOAD), ("recompute=all", Kind.R)])
def test_memory_arguments_take_the_chunks_it_leaves(extra: str, kind: Kind) -> None:
    # docs/generators.md: `pipeoffload(chunks=1, offload=all)` / `pipeoffload(chunks=1, recompute=all)`
    prog = parse(f"pipeline ranks=4 microbatches=8\nuse pipeoffload(virtual=2, chunks=1, {extra})\n", "p.pps")
    assert [d for d in check(prog) if d.is_error] == []
    for rank, row in enumerate(prog.rows):
        moved = [(a.stage, a.microbatch) for a in row if a.kind is Kind.OFFLOAD]
        again = [(a.stage, a.microbatch) for a in row if a.kind is Kind.R]
        assert len(set(moved)) == len(moved) and not set(moved) & set(again)
        # chunk 0 (stage = rank) stays offloaded; chunk 1's microbatches take the argument's kind
        assert {s for s, _ in moved} >= {rank}
        taken = moved if kind is Kind.OFFLOAD else again
        assert sorted(m for s, m in taken if s == rank + 4) == list(range(8))
