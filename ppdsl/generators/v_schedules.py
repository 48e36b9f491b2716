"""Controllable-memory V schedules (Qi et al., Pipeline Parallelism with Controllable Memory, 2024).

Two stages per rank in a V (rank r holds r and 2p-1-r), backward split into `I` and `W`.
The paper derives each schedule from a repeating building block whose lifespan sets the
peak memory; published peaks, in microbatches of a whole rank's layers (1F1B's unit, whose
peak is p): V-Half (p+2)//2, V-Min (p+4)//3.

Here the same budgets, counted in chunk activations (two per microbatch: 2*((p+2)//2) and
2*((p+4)//3)), drive the list scheduler of `greedy.py`: backward first, then a forward
within the budget (a microbatch is admitted only when the budget also holds its chunk-1
forward), then a deferred W. The peaks match the paper exactly; the bubbles differ, see
docs/generators.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ..placement import v_shape
from . import greedy
from .registry import ArgValue, Built, GeneratorSpec


def half_budget(ranks: int) -> int:
    """V-Half's peak in chunk activations: (p+2)//2 microbatches of two chunks."""
    return 2 * ((ranks + 2) // 2)


def min_budget(ranks: int) -> int:
    """V-Min's peak in chunk activations: (p+4)//3 microbatches of two chunks."""
    return 2 * ((ranks + 4) // 3)


def _builder(budget: Callable[[int], int]) -> Callable[[int, int, Mapping[str, ArgValue]], Built]:
    def build(ranks: int, microbatches: int, args: Mapping[str, ArgValue]) -> Built:
        stages = 2 * ranks
        placement = v_shape(ranks, stages)
        rows = greedy.schedule(ranks, microbatches, placement, [budget(ranks)] * ranks)
        return Built(rows, stages, placement)
    return build


REFERENCE = "Qi et al., Pipeline Parallelism with Controllable Memory (NeurIPS 2024), sec. 4"

SPECS = (
    GeneratorSpec(
        name="v_half",
        summary="V schedule with about half of 1F1B's activation memory",
        placement="v, 2 stages per rank",
        build=_builder(half_budget),
        reference=REFERENCE,
    ),
    GeneratorSpec(
        name="v_min",
        summary="V schedule with about a third of 1F1B's activation memory",
        placement="v, 2 stages per rank",
        build=_builder(min_budget),
        reference=REFERENCE,
    ),
)
