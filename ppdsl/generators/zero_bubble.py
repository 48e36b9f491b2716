"""Zero-bubble schedules on one stage per rank (Qi et al., Zero Bubble Pipeline Parallelism, 2023).

The backward is split into the input gradient `I`, which the previous stage waits for, and the
weight gradient `W`, which nobody waits for and so can fill what would be idle time.

`zb1p` (ZB-H1): 1F1B with `I` in place of `B`; rank r defers its weight gradients by r
microbatches (PyTorch's `num_1f1b_microbatches = rank`), so a W lands in every slot where
1F1B would idle while the input gradient travels. Every rank keeps at most p activations,
1F1B's peak. Under F = I = W the idle time per rank falls from 1F1B's 3(p-1) to p-1.

`zb2p` (ZB-H2): twice the in-flight budget (2p activations per rank): the warm-up runs enough
forwards to cover the round trip of the first microbatch, and the deferred W's fill the tail.
Built by the list scheduler in `greedy.py` (backward first, then forward within the budget,
then W). With F = I = W no rank idles between its first and its last action; what remains is
the p-1 skew of a parallelogram (rank r starts r steps late), which the paper hides by
overlapping the optimizer step with the next iteration.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..ir import Kind, Step, make_action
from ..placement import loop
from . import greedy
from .registry import ArgValue, Built, GeneratorSpec, every_slot


def zb1p_row(rank: int, ranks: int, microbatches: int) -> tuple[Step, ...]:
    warmup = min(ranks - 1 - rank, microbatches)
    row: list[Step] = [make_action(rank, Kind.F, m) for m in range(warmup)]
    w_done = 0
    for i in range(microbatches):
        if warmup + i < microbatches:
            row.append(make_action(rank, Kind.F, warmup + i))
        row.append(make_action(rank, Kind.I, i))
        if i >= rank:
            row.append(make_action(rank, Kind.W, w_done))
            w_done += 1
    row += [make_action(rank, Kind.W, m) for m in range(w_done, microbatches)]
    return tuple(row)


def build_zb1p(ranks: int, microbatches: int, args: Mapping[str, ArgValue]) -> Built:
    rows = tuple(zb1p_row(r, ranks, microbatches) for r in range(ranks))
    return Built(rows, ranks, loop(ranks, ranks))


def build_zb2p(ranks: int, microbatches: int, args: Mapping[str, ArgValue]) -> Built:
    placement = loop(ranks, ranks)
    rows = greedy.schedule(ranks, microbatches, placement, [2 * ranks] * ranks)
    return Built(rows, ranks, placement)


REFERENCE = "Qi et al., Zero Bubble Pipeline Parallelism (ICLR 2024), sec. 3; PyTorch ScheduleInterleavedZeroBubble"

SPECS = (
    GeneratorSpec(
        name="zb1p",
        summary="zero bubble H1: backward split into I and W, W deferred, 1F1B's peak memory",
        placement="loop, one stage per rank",
        build=build_zb1p,
        steps=every_slot(3),
        reference=REFERENCE,
    ),
    GeneratorSpec(
        name="zb2p",
        summary="zero bubble H2: 2p activations in flight, no idle step inside a rank when F=I=W",
        placement="loop, one stage per rank",
        build=build_zb2p,
        steps=every_slot(3),
        reference=REFERENCE,
    ),
)
