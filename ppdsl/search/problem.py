"""What a search is asked: the pipeline's shape, each action's duration, the memory limit.

Memory is counted in the unit a user reasons about: one microbatch's activations of a rank's
whole share of the model. A stage of a rank that holds v stages keeps 1/v of that, so a V
schedule's chunk counts 1/2 (the weighting of `schedules/README.md`'s last column). The
checker's `--max-memory` counts stage activations instead; `stage_limit` converts.
"""

from __future__ import annotations

from collections.abc import Sequence

from attrs import frozen

from ..costs import DEFAULT, CostModel
from ..ir import Kind
from ..placement import loop, v_shape

# A limit is compared after adding weights such as 1/3 a few thousand times: absorb the rounding.
EPSILON = 1e-9


@frozen
class Problem:
    """One search input. `cost[s]` is (F, I, W, B) of stage s; `weight[s]` its activation's share."""

    ranks: int
    microbatches: int
    placement: tuple[int, ...]
    cost: tuple[tuple[float, float, float, float], ...]
    comm: float
    limit: float
    split: bool = True

    @property
    def stages(self) -> int:
        return len(self.placement)

    @property
    def stages_per_rank(self) -> int:
        return self.stages // self.ranks

    @property
    def weight(self) -> tuple[float, ...]:
        return tuple(1.0 / self.stages_per_rank for _ in self.placement)

    def with_split(self, split: bool) -> Problem:
        return Problem(self.ranks, self.microbatches, self.placement, self.cost, self.comm, self.limit, split)


def shape(ranks: int, stages_per_rank: int) -> tuple[int, ...]:
    """Loop for one stage a rank, V for two: the two shapes the search considers."""
    return loop(ranks, ranks) if stages_per_rank == 1 else v_shape(ranks, 2 * ranks)


def make_problem(ranks: int, microbatches: int, stages_per_rank: int, limit: float,
                 costs: CostModel = DEFAULT, split: bool = True) -> Problem:
    """A problem for `costs` as `ppdsl simulate` reads them (a rank's share divided among its stages)."""
    placement = shape(ranks, stages_per_rank)
    stages = len(placement)
    table = costs.table(stages, [stages_per_rank] * stages)
    cost = tuple((row[Kind.F], row[Kind.I], row[Kind.W], row[Kind.B]) for row in table)
    return Problem(ranks, microbatches, placement, cost, costs.message_time, limit, split)


def stage_limit(limit: float, stages_per_rank: int) -> float:
    """The same limit in stage activations, the unit of `ppdsl lint --max-memory`."""
    return limit * stages_per_rank


def rank_weights(placement: Sequence[int], ranks: int) -> list[float]:
    """Per stage, its share of its rank's layers (1/v when the rank holds v stages)."""
    held = [0] * ranks
    for r in placement:
        held[r] += 1
    return [1.0 / held[r] for r in placement]
