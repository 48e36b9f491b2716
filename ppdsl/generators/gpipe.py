"""GPipe (Huang et al., 2019), Paddle's `FThenB`: every forward, then every backward.

Bubble (p-1)/(m+p-1) under equal costs; each rank holds all m activations at the turn.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..ir import Action, Kind, Step
from ..placement import loop
from .registry import ArgValue, Built, GeneratorSpec, every_slot


def build(ranks: int, microbatches: int, args: Mapping[str, ArgValue]) -> Built:
    rows: list[tuple[Step, ...]] = []
    for r in range(ranks):
        forwards: list[Step] = [Action(r, Kind.F, m) for m in range(microbatches)]
        backwards: list[Step] = [Action(r, Kind.B, m) for m in range(microbatches)]
        rows.append(tuple(forwards + backwards))
    return Built(tuple(rows), ranks, loop(ranks, ranks))


SPEC = GeneratorSpec(
    name="gpipe",
    aliases=("fthenb",),
    summary="all forwards, then all backwards",
    placement="loop, one stage per rank",
    build=build,
    steps=every_slot(2),
    params=(),
    reference="Huang et al., GPipe (2019); Paddle ScheduleFThenB",
)
