"""ZB-V (Qi et al., Zero Bubble Pipeline Parallelism, 2023/2024), PyTorch's `ScheduleZBVZeroBubble`.

Two stages per rank in a V: rank r holds stage r (chunk 0, going down) and stage 2p-1-r
(chunk 1, coming back), so the last stage sits on rank 0 beside the first. Each backward is
split into input gradient `I` and weight gradient `W`.

Rank r runs, with n = max(m, 2p-1) microbatches (PyTorch pads small counts with phantom
microbatches and drops their actions afterwards, which keeps the order valid):
- warm-up: 2(p-r)-1 chunk-0 forwards; r pairs (chunk-1 F, chunk-0 F); p-r triples of chunk 1
  (F, I, W);
- steady: chunk-0 (F, I, W) then chunk-1 (F, I, W), until every forward is issued;
- cool-down: r pairs of input gradients (chunk 0, chunk 1), then p-r chunk-0 (I, W), then
  the deferred weight gradients, chunk 1 first.

Peak activation memory is 1F1B's (p microbatches of a whole rank's layers = 2p chunk
activations); with F = I = W the pipeline is full between warm-up and cool-down.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..ir import Kind, Step, make_action
from ..placement import v_shape
from .registry import ArgValue, Built, GeneratorSpec, every_slot


def rank_row(rank: int, ranks: int, microbatches: int) -> tuple[Step, ...]:
    n = max(2 * ranks - 1, microbatches)
    M = microbatches
    c0, c1 = rank, 2 * ranks - 1 - rank
    F, I, W = Kind.F, Kind.I, Kind.W
    ops: list[tuple[int, Kind, int]] = []

    # Each microbatch counter only grows, so once every counter a loop advances is past the
    # real microbatches, the rest of the loop is phantoms: skip it by arithmetic. With few
    # microbatches and many ranks the padded loops are O(ranks) per rank, 4e9 steps in all
    # at 65,536 ranks; this way a rank costs what it outputs.
    def real(count: int, *counters: int) -> int:
        return min(count, max(0, M - min(counters)))

    f0 = f1 = b0 = b1 = 0
    count = 2 * (ranks - rank) - 1
    for _ in range(real(count, f0)):
        ops.append((c0, F, f0))
        f0 += 1
    f0 = count
    count = rank
    done = real(count, f0, f1)
    for _ in range(done):
        ops += [(c1, F, f1), (c0, F, f0)]
        f1 += 1
        f0 += 1
    f0, f1 = f0 + count - done, f1 + count - done
    count = ranks - rank
    done = real(count, f1, b1)
    for _ in range(done):
        ops += [(c1, F, f1), (c1, I, b1), (c1, W, b1)]
        f1 += 1
        b1 += 1
    f1, b1 = f1 + count - done, b1 + count - done
    while (f1 < f0 or f0 < n) and min(b0, f1, b1, f0 if f0 < n else M) < M:
        if f0 < n:
            ops.append((c0, F, f0))
            f0 += 1
        ops += [(c0, I, b0), (c0, W, b0), (c1, F, f1), (c1, I, b1), (c1, W, b1)]
        b0 += 1
        f1 += 1
        b1 += 1
    rest = max(f0, n) - f1 if (f1 < f0 or f0 < n) else 0
    f0 = max(f0, n) if rest else f0
    b0, f1, b1 = b0 + rest, f1 + rest, b1 + rest
    w0, w1 = b0, b1
    count = rank
    done = real(count, b0, b1)
    for _ in range(done):
        ops += [(c0, I, b0), (c1, I, b1)]
        b0 += 1
        b1 += 1
    b0, b1 = b0 + count - done, b1 + count - done
    count = ranks - rank
    done = real(count, b0, w0)
    for _ in range(done):
        ops += [(c0, I, b0), (c0, W, w0)]
        b0 += 1
        w0 += 1
    b0, w0 = b0 + count - done, w0 + count - done
    ops += [(c1, W, w) for w in range(w1, min(b1, M))]
    ops += [(c0, W, w) for w in range(w0, min(b0, M))]
    # Phantom microbatches (those PyTorch pads small counts with) are dropped.
    return tuple(make_action(s, k, m) for s, k, m in ops if m < microbatches)


def build(ranks: int, microbatches: int, args: Mapping[str, ArgValue]) -> Built:
    stages = 2 * ranks
    return Built(tuple(rank_row(r, ranks, microbatches) for r in range(ranks)), stages, v_shape(ranks, stages))


SPEC = GeneratorSpec(
    name="zbv",
    summary="zero-bubble V schedule: split backward, 2 stages per rank in a V, 1F1B's memory",
    placement="v, 2 stages per rank",
    build=build,
    steps=every_slot(3, stages_per_rank=2),
    reference="Qi et al., Zero Bubble Pipeline Parallelism (ICLR 2024), sec. 6 (ZB-V); "
              "PyTorch ScheduleZBVZeroBubble",
)
