"""Stage -> rank maps: the named shapes, and inference from which row holds a stage."""

from __future__ import annotations

from collections.abc import Sequence

from .ir import Step, actions_of


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
    for rank, row in enumerate(rows):
        for step in row:
            for action in actions_of(step):
                seen.setdefault(action.stage, set()).add(rank)
    return seen


def infer(rows: Sequence[Sequence[Step]], stages: int) -> tuple[dict[int, set[int]], list[int]]:
    """Which ranks each stage's actions appear on, and the stages that appear nowhere."""
    seen = stage_ranks(rows)
    return seen, [s for s in range(stages) if s not in seen]
