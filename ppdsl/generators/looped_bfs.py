"""Looped BFS (Lamy-Poirier, Breadth-First Pipeline Parallelism, 2023), PyTorch's `ScheduleLoopedBFS`.

Stage s on rank s % p (loop placement), `virtual=v` stages per rank. Each rank runs every
microbatch's forward through its first local stage, then through its second, ..., then the
backwards through its local stages in reverse, newest microbatch first (the last stage can
start on the microbatch it has just finished). Breadth-first order keeps each stage's
weights busy for a long run, which suits sharded data parallelism, at the price of holding
all v*m activations of a rank at the turn.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..ir import Kind, Step, make_action
from ..placement import loop
from .registry import ArgValue, Built, GeneratorSpec, Param, every_slot


def rank_row(rank: int, ranks: int, microbatches: int, virtual: int) -> tuple[Step, ...]:
    local = [c * ranks + rank for c in range(virtual)]
    row: list[Step] = [make_action(s, Kind.F, m) for s in local for m in range(microbatches)]
    row += [make_action(s, Kind.B, m) for s in reversed(local) for m in reversed(range(microbatches))]
    return tuple(row)


def build(ranks: int, microbatches: int, args: Mapping[str, ArgValue]) -> Built:
    virtual = int(args["virtual"])
    stages = ranks * virtual
    rows = tuple(rank_row(r, ranks, microbatches, virtual) for r in range(ranks))
    return Built(rows, stages, loop(ranks, stages))


SPEC = GeneratorSpec(
    name="looped_bfs",
    summary="breadth-first over the `virtual` local stages of each rank",
    placement="loop, `virtual` stages per rank",
    build=build,
    steps=every_slot(2, virtual="virtual"),
    params=(Param("virtual", int, 2, "stages per rank", minimum=1),),
    reference="Lamy-Poirier, Breadth-First Pipeline Parallelism (MLSys 2023); PyTorch ScheduleLoopedBFS",
)
