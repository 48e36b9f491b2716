"""Per-stage figures measured on one cut of the model, carried over to another.

Stages are equal cuts of the model's layers in model order, so a figure of stage s (a time,
a size in bytes) belongs to the layers that stage holds. Measured on `given` cuts and asked
for `stages` cuts, stage s of `stages` holds a share of one measured cut (when there are more
stages) or several whole measured cuts (when fewer): "the first layers are heavier" stays
true in every shape. Only shapes that divide one another carry over: a 3-stage measurement
says nothing exact about the layers of a stage of 2.
"""

from __future__ import annotations

from collections.abc import Mapping


def carries(given: int, stages: int) -> bool:
    """Whether figures of `given` cuts carry over to `stages` cuts (one divides the other)."""
    return given > 0 and stages > 0 and (stages % given == 0 or given % stages == 0)


def carried(per_cut: Mapping[int, float], given: int, stages: int, default: float = 0.0) -> list[float]:
    """Per stage of `stages` cuts, from `per_cut[c]` of `given` cuts (`default` for a cut not
    measured). A stage that is a share of a cut takes that share of it; one that holds several
    cuts, their sum. Needs `carries(given, stages)`."""
    if not carries(given, stages):
        raise ValueError(f"figures of {given} stages do not carry over to {stages}")
    if stages >= given:
        ratio = stages // given
        return [per_cut.get(s // ratio, default) / ratio for s in range(stages)]
    ratio = given // stages
    return [sum(per_cut.get(c, default) for c in range(s * ratio, (s + 1) * ratio)) for s in range(stages)]
