"""DualPipeV (DeepSeek, DualPipe cut in half; PyTorch's `ScheduleDualPipeV`).

Two stages per rank in a V (rank r holds chunk 0 = stage r and chunk 1 = stage 2p-1-r). In
the steady state a rank runs a forward of one chunk overlapped with a backward of the other,
`(aFm;bBn)`, so one microbatch's communication hides behind the other's compute. Rank r runs
eight phases (DeepSeek's `dualpipev.py`, with p ranks and m microbatches):

1. 2(p-r-1) chunk-0 forwards;
2. r+1 pairs: chunk-0 F, chunk-1 F;
3. p-r-1 triples: chunk-1 I, chunk-1 W, chunk-1 F;
4. m-2p+r+1 times: (chunk-0 F; chunk-1 B), (chunk-1 F; chunk-0 B); on the last rank the first
   pair runs unoverlapped, which shortens the bubble;
5. p-r-1 times: chunk-1 B, (chunk-1 F; chunk-0 B);
6. r+1 times: chunk-1 B, chunk-0 B, where the second half of these backwards run as I only
   and queue their W;
7. p-r-1 times: a queued W, then chunk-0 I (queuing its W);
8. the r+1 queued W's.

Phase 4 runs at least once on rank 0 only if m >= 2p: DualPipeV needs twice as many
microbatches as ranks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from ..ir import Action, Kind, Overlap, Step, make_action
from ..placement import v_shape
from .registry import ArgValue, Built, GeneratorSpec, require


class _Rank:
    """One rank's counters: the next microbatch of each (chunk, kind), and the queued W's."""

    def __init__(self, rank: int, ranks: int):
        self.stage = (rank, 2 * ranks - 1 - rank)
        self.next_f = [0, 0]
        self.next_b = [0, 0]
        self.w_queue: deque[Action] = deque()
        self.row: list[Step] = []

    def forward(self, chunk: int) -> Action:
        a = make_action(self.stage[chunk], Kind.F, self.next_f[chunk])
        self.next_f[chunk] += 1
        return a

    def backward(self, chunk: int, split: bool) -> Action:
        s, m = self.stage[chunk], self.next_b[chunk]
        self.next_b[chunk] += 1
        if split:
            self.w_queue.append(make_action(s, Kind.W, m))
            return make_action(s, Kind.I, m)
        return make_action(s, Kind.B, m)

    def overlapped(self, f_chunk: int, b_chunk: int) -> None:
        f = self.forward(f_chunk)
        self.row.append(Overlap((f, self.backward(b_chunk, False))))

    def weight(self) -> None:
        self.row.append(self.w_queue.popleft())


def rank_row(rank: int, ranks: int, microbatches: int) -> tuple[Step, ...]:
    p, r = ranks, rank
    k = _Rank(r, p)
    row = k.row
    row.extend(k.forward(0) for _ in range(2 * (p - r - 1)))
    for _ in range(r + 1):
        row.append(k.forward(0))
        row.append(k.forward(1))
    for _ in range(p - r - 1):
        row.append(k.backward(1, True))
        k.weight()
        row.append(k.forward(1))
    for i in range(microbatches - 2 * p + r + 1):
        if i == 0 and r == p - 1:
            row.append(k.forward(0))
            row.append(k.backward(1, False))
        else:
            k.overlapped(0, 1)
        k.overlapped(1, 0)
    for _ in range(p - r - 1):
        row.append(k.backward(1, False))
        k.overlapped(1, 0)
    for i in range(2 * (r + 1)):
        row.append(k.backward(1 if i % 2 == 0 else 0, split=i >= r + 1))
    for _ in range(p - r - 1):
        k.weight()
        row.append(k.backward(0, True))
    while k.w_queue:
        k.weight()
    return tuple(row)


def build(ranks: int, microbatches: int, args: Mapping[str, ArgValue]) -> Built:
    require(microbatches >= 2 * ranks,
            f"dualpipev needs at least twice as many microbatches as ranks: "
            f"{microbatches} microbatches < 2 x {ranks} ranks = {2 * ranks}",
            None, help=f"use microbatches={2 * ranks} or more, or fewer ranks")
    stages = 2 * ranks
    return Built(tuple(rank_row(r, ranks, microbatches) for r in range(ranks)), stages, v_shape(ranks, stages))


def steps(ranks: int, microbatches: int, args: Mapping[str, ArgValue], inference: bool) -> int:
    """What `build` makes, phase by phase summed over the ranks (an overlapped pair is one step):
    9 steps per rank of phases 1, 3, 5 and 7 for each rank below it, 5 of phases 2, 6 and 8 for
    it and each rank above, two per round of phase 4, and the last rank's unoverlapped pair."""
    p, m = ranks, microbatches
    if inference:
        return 2 * p * m  # a forward per stage and microbatch
    below = p * (p - 1) // 2  # sum over r of p - r - 1
    upto = p * (p + 1) // 2  # sum over r of r + 1
    rounds = max(0, p * (m - 2 * p) + upto)  # sum over r of m - 2p + r + 1 (never negative when m >= 2p)
    return 9 * below + 5 * upto + 2 * rounds + (1 if m - p > 0 else 0)


SPEC = GeneratorSpec(
    name="dualpipev",
    summary="DeepSeek's DualPipe cut in half: overlapped forward/backward pairs (aFm;bBn) on a V",
    placement="v, 2 stages per rank",
    build=build,
    steps=steps,
    reference="DeepSeek-V3 Technical Report (2024) and deepseek-ai/DualPipe (DualPipeV); "
              "PyTorch ScheduleDualPipeV",
)
