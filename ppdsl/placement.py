"""Stage -> rank maps: the named shapes, and inference from which row holds a stage."""

from __future__ import annotations

from collections.abc import Sequence

from .ir import KIND_BITS, LazyRows, Step, actions_of


def loop(ranks: int, stages: int) -> tuple[int, ...]:
    """Stage s on rank s mod R: Megatron's interleaved layout, and plain 1 stage per rank."""
    return tuple(s % ranks for s in range(stages))


def v_shape(ranks: int, stages: int) -> tuple[int, ...]:
    """Rank r holds stages r and 2R-1-r (the V of ZB-V and DualPipeV); more stages zig-zag."""
    out = []
    for s in range(stages):
        lap, offset = divmod(s, ranks)
        out.append(offset if lap % 2 == 0 else ranks - 1 - offset)
    return tuple(out)


NAMED = {"loop": loop, "v": v_shape}


def name_of(placement: Sequence[int], ranks: int) -> str | None:
    """`loop` or `v` when the map is that shape, else None (it is then written as a list)."""
    for name, build in NAMED.items():
        if tuple(placement) == build(ranks, len(placement)):
            return name
    return None


def stage_ranks(rows: Sequence[Sequence[Step]]) -> dict[int, set[int]]:
    """Which ranks each stage's actions appear on (stages with no action are absent)."""
    seen: dict[int, set[int]] = {}
    codes = rows.codes if isinstance(rows, LazyRows) else [None] * len(rows)
    for rank, as_read in enumerate(codes):
        if as_read is not None:  # a row its reader kept as integers: its stages without its actions
            for sk in set(as_read[0]):
                if sk is not None:
                    seen.setdefault(sk >> KIND_BITS, set()).add(rank)
            continue
        for step in rows[rank]:
            for action in actions_of(step):
                seen.setdefault(action.stage, set()).add(rank)
    return seen


def infer(rows: Sequence[Sequence[Step]], stages: int) -> tuple[dict[int, set[int]], list[int]]:
    """Which ranks each stage's actions appear on, and the stages that appear nowhere."""
    seen = stage_ranks(rows)
    return seen, [s for s in range(stages) if s not in seen]
