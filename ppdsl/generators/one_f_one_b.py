"""1F1B (PipeDream-Flush; Narayanan et al., 2021), Paddle's `Schedule1F1B`.

Rank r runs min(p-r-1, m) warm-up forwards, then alternates one forward and one backward,
then drains the remaining backwards. Same bubble as GPipe, (p-1)/(m+p-1), but rank r holds
at most min(p-r, m) activations instead of m.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..ir import Action, Kind, Step
from ..placement import loop
from .registry import ArgValue, Built, GeneratorSpec, every_slot


def rank_row(rank: int, ranks: int, microbatches: int) -> tuple[Step, ...]:
    warmup = min(ranks - rank - 1, microbatches)
    row: list[Step] = [Action(rank, Kind.F, m) for m in range(warmup)]
    for i in range(microbatches - warmup):
        row.append(Action(rank, Kind.F, warmup + i))
        row.append(Action(rank, Kind.B, i))
    row.extend(Action(rank, Kind.B, m) for m in range(microbatches - warmup, microbatches))
    return tuple(row)


def build(ranks: int, microbatches: int, args: Mapping[str, ArgValue]) -> Built:
    return Built(tuple(rank_row(r, ranks, microbatches) for r in range(ranks)), ranks, loop(ranks, ranks))


SPEC = GeneratorSpec(
    name="1f1b",
    summary="warm-up, one forward one backward, cool-down",
    placement="loop, one stage per rank",
    build=build,
    steps=every_slot(2),
    reference="Narayanan et al., Efficient Large-Scale Language Model Training (2021); Paddle Schedule1F1B",
)
