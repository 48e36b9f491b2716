"""`ppdsl search --max-memory 3GiB`: a limit in bytes, in the search's memory model.

With a profile's sizes (`memory.Sizes`), rank r has `limit - state[r]` bytes for activations
(its stages' weights, gradients and optimizer state live all step), and an activation of
stage s takes `activation[s]` bytes from its `F` to its `I`, then `kept[s]` until its `W`.
The search counts a stage's activation from `F` to `W` against one limit for every rank
(`problem.Problem.weights`), so each stage weighs its bytes over what its rank has, against a
limit of 1: a rank's live weights stay within 1 exactly when its live bytes stay within the
limit. The one part the search does not count is what an `I` frees before its `W`: it holds
the larger of `activation[s]` and `kept[s]` from `F` to `W`. That is the tightest conversion
that is never under the bytes (`memory.peak_bytes`, which `ppdsl lint` checks); it is exact
for a schedule whose every `W` follows its `I` at once, and over by at most
`activation - kept` for each `W` deferred past its `I`.
"""

from __future__ import annotations

from attrs import frozen

from ..costs import CostModel
from ..cuts import carries
from ..memory import EPSILON, BytesProfile, Sizes, peak_bytes
from ..ir import Program
from .named import NamedResult, named_results
from .problem import shape

# The limit a problem in bytes is searched under: every weight is a fraction of its rank's room.
SCALED_LIMIT = 1.0
COUNTED = "each stage's activation counted as the larger of its activation and kept bytes from its F to its W"


@frozen
class ByteLimit:
    """A limit of `limit` bytes on every rank, with `sizes` measured on any cut of the model."""

    limit: float
    sizes: Sizes

    def counted(self, stages: int) -> list[float]:
        """Per stage of `stages` cuts, the bytes the search holds for one activation."""
        sizes = self.sizes.for_stages(stages)
        return [max(a, k) for a, k in zip(sizes.activation, sizes.kept)]

    def smallest(self, ranks: int, stages_per_rank: int) -> float:
        """The smallest limit in bytes a shape runs under: a rank's state and one
        microbatch's activations of every stage it holds (what `search.driver.SMALLEST_LIMIT` is in
        the unit)."""
        placement = shape(ranks, stages_per_rank)
        counted = self.counted(len(placement))
        state = self.sizes.for_stages(len(placement)).state_of_ranks(placement)
        need = list(state)
        for s, r in enumerate(placement):
            need[r] += counted[s]
        return max(need)

    def fits(self, ranks: int, stages_per_rank: int) -> bool:
        return self.smallest(ranks, stages_per_rank) <= self.limit * (1 + EPSILON)

    def weights(self, ranks: int, stages_per_rank: int) -> tuple[float, ...]:
        """Per stage, its activation's bytes over its rank's room, against `SCALED_LIMIT`
        (needs `fits`: every rank then has room for more than its state)."""
        placement = shape(ranks, stages_per_rank)
        counted = self.counted(len(placement))
        state = self.sizes.for_stages(len(placement)).state_of_ranks(placement)
        room = [self.limit - st for st in state]
        assert min(room) > 0, "weights of a shape that does not fit"
        return tuple(SCALED_LIMIT * counted[s] / room[r] for s, r in enumerate(placement))

    def peak(self, program: Program) -> BytesProfile | None:
        """The program's peak bytes per rank (the checker's model), None when the sizes do not
        carry over to its stages."""
        if not carries(self.sizes.stages, program.stages):
            return None
        return peak_bytes(program, self.sizes.for_stages(program.stages))


@frozen
class NamedInBytes:
    result: NamedResult
    peak: float  # bytes, the highest rank's


def best_named(ranks: int, microbatches: int, costs: CostModel, cuts: int, limit: ByteLimit,
               stages_per_rank: tuple[int, ...] = (1, 2)) -> NamedInBytes | None:
    """The shortest named generator of these shapes whose peak bytes (the checker's model) are within the limit."""
    for n in named_results(ranks, microbatches, costs, cuts):
        if n.program.stages // ranks not in stages_per_rank:
            continue
        peak = limit.peak(n.program)
        if peak is not None and max(peak.peak) <= limit.limit * (1 + EPSILON):
            return NamedInBytes(n, max(peak.peak))
    return None


@frozen
class InBytes:
    """What a search in bytes reports beside the result: the limit, the found program's peak
    bytes (the checker's model) and the best named generator within the limit."""

    limit: ByteLimit
    peak: BytesProfile
    named: NamedInBytes | None
