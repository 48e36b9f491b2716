"""What a search is asked: the pipeline's shape, each action's duration, the memory limit.

Memory is counted in `ppdsl.memory`'s unit, the checker's and the simulator's: one
microbatch's activations of a rank's whole share of the model (a V chunk counts 1/2).
"""

from __future__ import annotations

import functools

from attrs import frozen

from ..costs import DEFAULT, CostModel, reshape
from ..ir import Kind
from ..memory import rank_weights
from ..placement import loop, v_shape
from .slots import CodeTables, SlotRules



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
    # Per stage, what its activation counts against `limit` when not its share of the rank
    # (`byte_limit`: its bytes over what its rank has for activations, against a limit of 1).
    weights: tuple[float, ...] | None = None

    @property
    def stages(self) -> int:
        return len(self.placement)

    @property
    def stages_per_rank(self) -> int:
        return self.stages // self.ranks

    @property
    def weight(self) -> tuple[float, ...]:
        return self.weights if self.weights is not None else tuple(rank_weights(self.placement, self.ranks))

    @functools.cached_property
    def rules(self) -> SlotRules:
        """The engine's and the memory model's rules in the search's layout (`slots`)."""
        return SlotRules(self.stages, self.microbatches, self.placement, self.split)

    @functools.cached_property
    def tables(self) -> CodeTables:
        """`rules` per search code, made once per problem: every order priced reads them."""
        return CodeTables(self.rules, self.microbatches, self.cost, self.comm, self.weight)

    def with_split(self, split: bool) -> Problem:
        return Problem(self.ranks, self.microbatches, self.placement, self.cost, self.comm, self.limit, split,
                       self.weights)


def shape(ranks: int, stages_per_rank: int) -> tuple[int, ...]:
    """Loop for one stage a rank, V for two: the two shapes the search considers."""
    return loop(ranks, ranks) if stages_per_rank == 1 else v_shape(ranks, 2 * ranks)


def make_problem(ranks: int, microbatches: int, stages_per_rank: int, limit: float,
                 costs: CostModel = DEFAULT, split: bool = True, cuts: int | None = None,
                 weights: tuple[float, ...] | None = None) -> Problem:
    """A problem for `costs` as `ppdsl simulate` reads them (a rank's share divided among its
    stages). `weights`: per stage, what an activation counts against `limit` (see `Problem`)."""
    placement = shape(ranks, stages_per_rank)
    stages = len(placement)
    if cuts is None:
        cuts = cuts_of(costs, ranks)
        if cuts is None:
            raise ValueError("per-stage costs name a stage past two a rank")
    table = reshape(costs, cuts, stages).table(stages, [stages_per_rank] * stages)
    cost = tuple((row[Kind.F], row[Kind.I], row[Kind.W], row[Kind.B]) for row in table)
    return Problem(ranks, microbatches, placement, cost, costs.message_time, limit, split, weights)


def cuts_of(costs: CostModel, ranks: int) -> int | None:
    """How many equal cuts of the model the per-stage keys of `costs` describe: 0 (none), one
    a rank (loop stages, the highest named below `ranks`) or two a rank (V stages); None if
    a key names a stage past 2 x ranks."""
    highest = -1
    for key, _ in costs.items:
        head, sep, tail = key.partition("_s")
        if sep and tail.isdigit():
            highest = max(highest, int(tail))
    if highest < 0:
        return 0
    if highest < ranks:
        return ranks
    return 2 * ranks if highest < 2 * ranks else None
