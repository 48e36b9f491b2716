"""PPS301, PPS302: do the live activations of each rank fit?

Uses the activation model of `ppdsl.memory` (shared with the simulator): an `F` makes one
activation of its stage live (times the stage's weight), the `B` that consumes it frees it,
or the `W` when the backward is split; an overlapped pair counts both.

PPS301 - peak live activations on a rank exceed the limit (`memory=N` in the header, or
    `ppdsl lint --max-memory N`, which wins). The report names the rank and the step where
    the peak is first reached. Fix: fewer warm-up forwards on that rank (e.g. 1F1B instead
    of GPipe), or a higher limit.

PPS302 - memory weights given for another number of stages than the program has.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import accumulate, compress, repeat
from operator import and_, eq, rshift

from .. import memory
from ..diagnostics import Diagnostic
from ..english import plural
from ..semantics import B, F, I, W, Encoded
from .context import Context

FAMILY = "memory"
CODES = ("PPS301", "PPS302")
REQUIRES: tuple[str, ...] = ("structure", "completeness")  # families that must have found no error


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def check(ctx: Context) -> Iterator[Diagnostic]:
    limit = ctx.max_memory if ctx.max_memory is not None else ctx.program.memory_limit
    weights = ctx.memory_weights
    if weights is not None and len(weights) != ctx.S:
        yield ctx.diag("PPS302", f"{plural(len(weights), 'memory weight')} for {plural(ctx.S, 'stage')}", help="give one weight per stage")
        return
    if limit is None:
        return
    peaks = _fast_peaks(ctx, weights)
    if peaks is None:
        prof = memory.profile(ctx.program, weights)
        peaks = list(zip(prof.peak, prof.peak_step))
    source = "--max-memory" if ctx.max_memory is not None else "the header's `memory`"
    for rank, (peak, step) in enumerate(peaks):
        if peak > limit and step is not None:
            yield ctx.diag("PPS301", f"rank {rank} holds {_number(peak)} live activations at step {step}, "
                           f"over the limit of {_number(limit)} ({source})", rank, step,
                           help="start fewer forwards before the first backward on this rank, or raise the limit")


def _fast_peaks(ctx: Context, weights: Sequence[float] | None) -> list[tuple[float, int | None]] | None:
    """`memory.profile`'s peaks from the checker's encoding (completeness holds here)."""
    return peaks_from_codes(ctx.enc, weights, trusted=True)


def peaks_from_codes(enc: Encoded, weights: Sequence[float] | None, trusted: bool = False
                     ) -> list[tuple[float, int | None]] | None:
    """Per rank (peak, first step at the peak): `memory.profile`'s model computed from the
    integer codes, as prefix sums: the same numbers (a test compares them) at a fraction of
    the cost. An `F` adds its stage's weight; a `B` frees it, or a `W` when the backward is
    split (the program has an `I` for that stage and microbatch).

    None (use `memory.profile`) for rows with overlapped pairs, and, unless `trusted` (the
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
