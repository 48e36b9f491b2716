"""Interleaved 1F1B (Narayanan et al., 2021), Paddle's `ScheduleVPP`: `virtual=v` stages per rank.

Stage s lives on rank s % p (loop placement), so each rank holds v model chunks. Forwards walk
the chunks in rounds: a run of `k` microbatches through chunk 0, the same `k` through chunk 1,
..., then the next `k` microbatches; backwards walk the chunks in reverse. Megatron fixes k = p
and so needs m % p == 0; Paddle's ScheduleVPP (after PyTorch's flexible interleaving) takes
rounds = max(1, m // p) and k = m / rounds, so any m divisible by its round count works:
p=4 accepts m=3 (one round of 3), m=10 (two rounds of 5), but not m=9 (two rounds do not
divide 9).

Rank r runs (v-1)*k + 2*(p-1-r) warm-up forwards (capped at v*m), then one forward one
backward, then the remaining backwards: the order of Paddle's `_get_1f1b_rank_ops`. With
virtual=1 the warm-up is 1F1B's p-1-r (Paddle's formula would hold twice the activations for
no gain), so `vpp(virtual=1)` is exactly `1f1b`.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..ir import Kind, Step, make_action
from ..placement import loop
from .registry import ArgValue, Built, GeneratorSpec, Param, every_slot, require


def rounds_of(ranks: int, microbatches: int) -> tuple[int, int]:
    """(rounds, microbatches per round) as ScheduleVPP computes them."""
    rounds = max(1, microbatches // ranks)
    return rounds, microbatches // rounds


def check_microbatches(ranks: int, microbatches: int) -> int:
    """Microbatches per round, or a located error stating ScheduleVPP's rule with the numbers."""
    rounds, per_round = rounds_of(ranks, microbatches)
    ok = [n for n in range(max(1, microbatches - ranks), microbatches + ranks + 1)
          if n % max(1, n // ranks) == 0]
    near = ", ".join(str(n) for n in ok if abs(n - microbatches) <= ranks)
    require(microbatches % rounds == 0,
            f"interleaved 1F1B with {ranks} ranks and {microbatches} microbatches runs "
            f"max(1, {microbatches} // {ranks}) = {rounds} rounds, and {microbatches} microbatches "
            f"are not a multiple of {rounds}",
            None, help=f"use a microbatch count divisible by its round count, e.g. {near}")
    return per_round


def rank_row(rank: int, ranks: int, microbatches: int, virtual: int, per_round: int) -> tuple[Step, ...]:
    total = microbatches * virtual
    # With one chunk the rule would double 1F1B's warm-up for nothing; keep 1F1B's then.
    extra = 2 * (ranks - 1 - rank) if virtual > 1 else ranks - 1 - rank
    warmup = min((virtual - 1) * per_round + extra, total)
    span = per_round * virtual  # forward ops per block of `per_round` microbatches over all chunks
    F, B = Kind.F, Kind.B
    # The k-th forward op of this rank: chunk (k // per_round) % v, microbatch counted per round.
    fwd: list[Step] = [make_action(((k // per_round) % virtual) * ranks + rank, F, (k // span) * per_round + k % per_round)
           for k in range(total)]
    bwd: list[Step] = [make_action((virtual - 1 - (k // per_round) % virtual) * ranks + rank, B,
                       (k // span) * per_round + k % per_round)
           for k in range(total)]
    row: list[Step] = fwd[:warmup]
    steady = total - warmup
    for i in range(steady):
        row.append(fwd[warmup + i])
        row.append(bwd[i])
    row.extend(bwd[steady:])
    return tuple(row)


def build(ranks: int, microbatches: int, args: Mapping[str, ArgValue]) -> Built:
    virtual = int(args["virtual"])
    per_round = check_microbatches(ranks, microbatches)
    stages = ranks * virtual
    rows = tuple(rank_row(r, ranks, microbatches, virtual, per_round) for r in range(ranks))
    return Built(rows, stages, loop(ranks, stages))


SPEC = GeneratorSpec(
    name="interleaved_1f1b",
    aliases=("vpp", "interleaved"),
    summary="Megatron's interleaved 1F1B with `virtual` stages per rank (Paddle ScheduleVPP)",
    placement="loop, `virtual` stages per rank",
    build=build,
    steps=every_slot(2, virtual="virtual"),
    params=(Param("virtual", int, 2, "model chunks (stages) per rank", minimum=1),),
    reference="Narayanan et al., Efficient Large-Scale Language Model Training (2021), sec. 2.2; "
              "Paddle ScheduleVPP (paddle/distributed/auto_parallel/pipelining/schedules.py)",
)
