"""PPS301, PPS302: do the live activations of each rank fit?

Uses the one activation model, `ppdsl.memory` (shared with the simulator and the search), in
its unit: one microbatch's activations of a rank's whole share of the model. An `F` makes its
stage's share live (1/v when the rank holds v stages), the `B` that consumes it frees it, or
the `W` when the backward is split; an overlapped pair counts both.

PPS301 - peak live activations on a rank exceed the limit (`memory=N` in the header, or
    `ppdsl lint --max-memory N`, which wins). The report names the rank and the step where
    the peak is first reached. In bytes (`--max-memory 6GiB` with a profile's sizes), the
    rank's weights, gradients and optimizer state count too. Fix: fewer warm-up forwards on that rank (e.g. 1F1B instead
    of GPipe), or a higher limit.

PPS302 - memory weights given for another number of stages than the program has.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from .. import memory
from ..diagnostics import Diagnostic
from ..ir import Kind
from ..wording import plural
from .context import Context

FAMILY = "memory"
CODES = ("PPS301", "PPS302")
REQUIRES: tuple[str, ...] = ("structure", "completeness", "memory actions")  # families that must have found no error


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def check(ctx: Context) -> Iterator[Diagnostic]:
    limit = ctx.max_memory if ctx.max_memory is not None else ctx.program.memory_limit
    weights = ctx.memory_weights
    if weights is not None and len(weights) != ctx.S:
        yield ctx.diag("PPS302", f"{plural(len(weights), 'memory weight')} for {plural(ctx.S, 'stage')}", help="give one weight per stage")
        return
    if ctx.max_bytes is not None:
        yield from _check_bytes(ctx, *ctx.max_bytes)
        return
    if limit is None:
        return
    peaks = _fast_peaks(ctx, weights)
    if peaks is None:
        prof = memory.profile(ctx.program, weights)
        peaks = list(zip(prof.peak, prof.peak_step))
    source = "--max-memory" if ctx.max_memory is not None else "the header's `memory`"
    for rank, (peak, step) in enumerate(peaks):
        if memory.over(peak, limit) and step is not None:
            yield ctx.diag("PPS301", f"rank {rank} holds {_number(peak)} {memory.UNIT} at step {step}, "
                           f"over the limit of {_number(limit)} ({source})", rank, step,
                           help="start fewer forwards before the first backward on this rank, or raise the limit")


def _fast_peaks(ctx: Context, weights: Sequence[float] | None) -> list[tuple[float, int | None]] | None:
    """`memory.profile`'s peaks from the checker's encoding (completeness holds here)."""
    return memory.peaks_from_codes(ctx.enc, weights, trusted=True)


def _check_bytes(ctx: Context, limit: float, sizes: memory.Sizes) -> Iterator[Diagnostic]:
    """PPS301 in bytes: a rank's state and live activations against `--max-memory 6GiB`."""
    found = memory.peak_bytes(ctx.program, sizes)
    sharded = any(sizes.gathered) and int(Kind.UNSHARD) in ctx.enc.kinds
    gathered = " and gathered weights" if sharded else ""
    for rank, (peak, step) in enumerate(zip(found.peak, found.peak_step)):
        if peak > limit:
            at = f" at step {step}" if step is not None else ""
            yield ctx.diag("PPS301", f"rank {rank} holds {memory.bytes_text(peak)}{at} "
                           f"({memory.bytes_text(found.state[rank])} of weights, gradients and optimizer state and "
                           f"{memory.bytes_text(found.activations[rank])} of activations{gathered}), over the "
                           f"limit of {memory.bytes_text(limit)} (--max-memory)", rank, step,
                           help="start fewer forwards before the first backward on this rank, or raise the limit"
                           + (", or gather fewer stages at once (RESHARD earlier)" if gathered else ""))
