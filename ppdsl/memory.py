"""The activation memory model shared by the checker and the simulator.

A forward `F(s,m)` makes one activation of stage s live (weighted per stage when weights are
given); the backward that consumes it frees it: `B(s,m)`, or `W(s,m)` when the backward is
split, since the weight gradient still needs the saved inputs. In an overlapped pair the
forward allocates before the backward frees, so both count at that step. Peaks are measured
per rank in step order, which is the order a rank allocates in whatever the timing.
"""

from __future__ import annotations

from collections.abc import Sequence

from attrs import frozen

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
