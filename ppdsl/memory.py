"""The activation memory model shared by the checker and the simulator.

A forward `F(s,m)` makes one activation of stage s live (weighted per stage when weights are
given); the backward that consumes it frees it: `B(s,m)`, or `W(s,m)` when the backward is
split, since the weight gradient still needs the saved inputs. In an overlapped pair the
forward allocates before the backward frees, so both count at that step. Peaks are measured
per rank in step order, which is the order a rank allocates in whatever the timing.

`profile` follows the steps (and gives the live count after each); `peaks_from_codes` gives
the same peaks from the program's integer encoding by prefix sums, for the checker's PPS301
and the simulator's `peak_memory` (a test holds the two equal).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate, compress, repeat
from operator import and_, eq, rshift

from attrs import frozen

from .encoding import B, Encoded, F, I, W
from .ir import Kind, Program, actions_of


@frozen
class MemoryProfile:
    peak: tuple[float, ...]  # per rank
    peak_step: tuple[int | None, ...]  # per rank: the first step index at which the peak is reached
    live_after: tuple[tuple[float, ...], ...]  # per rank, per step: live activations after it


def profile(program: Program, weights: Sequence[float] | None = None) -> MemoryProfile:
    if weights is not None and len(weights) != program.stages:
        raise ValueError(f"memory weights give {len(weights)} stages, the program has {program.stages}")
    w = list(weights) if weights is not None else [1.0] * program.stages
    # Which (stage, microbatch) free on W rather than B: those whose backward is split.
    split = {(a.stage, a.microbatch) for _, _, a in program.actions() if a.kind is Kind.I}
    peaks: list[float] = []
    peak_steps: list[int | None] = []
    lives: list[tuple[float, ...]] = []
    for row in program.rows:
        live = 0.0
        peak = 0.0
        peak_step: int | None = None
        after: list[float] = []
        for index, step in enumerate(row):
            freed = 0.0
            for a in actions_of(step):
                k = a.kind
                if k is Kind.F:
                    live += w[a.stage]
                elif (k is Kind.B and (a.stage, a.microbatch) not in split) or (
                        k is Kind.W and (a.stage, a.microbatch) in split):
                    freed += w[a.stage]
            if live > peak:
                peak, peak_step = live, index
            live -= freed
            after.append(live)
        peaks.append(peak)
        peak_steps.append(peak_step)
        lives.append(tuple(after))
    return MemoryProfile(tuple(peaks), tuple(peak_steps), tuple(lives))


def peak_memory(program: Program, weights: Sequence[float] | None = None) -> tuple[float, ...]:
    """Peak live activations per rank."""
    return profile(program, weights).peak


def peaks_from_codes(enc: Encoded, weights: Sequence[float] | None, trusted: bool = False
                     ) -> list[tuple[float, int | None]] | None:
    """Per rank (peak, first step at the peak): `profile`'s model computed from the
    integer codes, as prefix sums: the same numbers (a test compares them) at a fraction of
    the cost. An `F` adds its stage's weight; a `B` frees it, or a `W` when the backward is
    split (the program has an `I` for that stage and microbatch).

    None (use `profile`) for rows with overlapped pairs, and, unless `trusted` (the
    checker, after completeness), when one sign per kind cannot say it: a `B` and an `I` of
    the same microbatch, or a `W` without its `I`."""
    if any(not is_batch for groups in enc.groups for is_batch, _ in groups.values()):
        return None
    sign = [0] * 16
    sign[F], sign[B] = 1, -1
    if I in enc.kinds:
        sign[W] = -1
        if not trusted:
            split: set[int] = set()
            frees_on_w: set[int] = set()
            full: set[int] = set()
            for codes in enc.codes:
                kinds = list(map(and_, codes, repeat(15)))
                for k, into in ((I, split), (W, frees_on_w), (B, full)):
                    into.update(map(rshift, compress(codes, map(eq, kinds, repeat(k))), repeat(4)))
            if not frees_on_w <= split or not full.isdisjoint(split):
                return None
    # Without any `I`, no backward is split: a `W` frees nothing (sign 0).
    out: list[tuple[float, int | None]] = []
    if weights is not None:
        M = enc.microbatches
        per_sm = [float(w) for w in weights for _ in range(M)]
    for rank, codes in enumerate(enc.codes):
        if weights is None:
            deltas: list[float] | list[int] = list(map(sign.__getitem__, map(and_, codes, repeat(15))))
        else:
            deltas = [per_sm[c >> 4] * sign[c & 15] for c in codes]
        live = list(accumulate(deltas))
        peak = max(live, default=0)
        if peak <= 0:
            out.append((0.0, None))
            continue
        out.append((float(peak), enc.step_of(rank, live.index(peak))))
    return out
