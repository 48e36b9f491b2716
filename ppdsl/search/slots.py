"""The search's action codes and the rules it prices them by, read from the encoding and the memory model.

The search numbers an action `sm * SLOTS + slot` (`sm = stage * microbatches + microbatch`,
the encoding's stage-and-microbatch number): slot FWD the forward, GRAD the input gradient
(the whole backward when unsplit), WGT the weight gradient. Three slots a stage and
microbatch keep a table over the search's codes short; the engine's codes leave room for
every kind. What a slot waits for, whether its input crosses ranks and what it does to
memory are not restated here: `SlotRules` translates `encoding.LOCAL_NEEDS`,
`encoding.INPUT_FROM_STAGE`, `encoding.PRODUCERS`, `encoding.input_tables` and
`memory.signs` into the search's layout, once per problem, and the replay, the list
scheduler and the MILP read those tables (a property test holds the replay equal to the
engine's run on random orders).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..encoding import B, F, I, INPUT_FROM_STAGE, LOCAL_NEEDS, PRODUCERS, W, input_tables
from ..memory import signs

FWD, GRAD, WGT = 0, 1, 2  # the slot of a search code
SLOTS = 3
NONE = 0  # an offset of 0: the slot has no such need (nothing waits for itself)


def search_code(sm: int, slot: int) -> int:
    """The search's code of slot `slot` of the stage-and-microbatch `sm`."""
    return sm * SLOTS + slot


def sm_and_slot(code: int) -> tuple[int, int]:
    """(sm, slot) of a search code."""
    return divmod(code, SLOTS)


def slot_kinds(split: bool) -> tuple[int | None, ...]:
    """Per slot, the Kind value it runs (None: no such action)."""
    return (F, I, W) if split else (F, B, None)


class SlotRules:
    """Per slot (index FWD, GRAD, WGT), for one problem:

    - `kind`: the Kind value it runs, also its column in `Problem.cost`;
    - `local`: the offset from a code to the code of its own (stage, microbatch) it waits for
      (`LOCAL_NEEDS`; NONE: none);
    - `step`: the stage its neighbour input comes from, relative to its own (`INPUT_FROM_STAGE`;
      0: none), and `input`: the offset from a code to that input's code;
    - `hop[slot][stage]`: whether that input crosses ranks, costing a message time (the
      engine's rule for a compute-only program, `input_tables`);
    - `sign`: what it does to its stage's activations (`memory.signs`).
    """

    __slots__ = ("kind", "local", "step", "input", "hop", "sign")

    def __init__(self, stages: int, microbatches: int, placement: Sequence[int], split: bool):
        kinds = slot_kinds(split)
        slot_of = {k: slot for slot, k in enumerate(kinds) if k is not None}
        self.kind = kinds
        self.local = [NONE] * SLOTS
        for needed, needer in LOCAL_NEEDS:
            if needer in slot_of and needed in slot_of:
                self.local[slot_of[needer]] = slot_of[needed] - slot_of[needer]
        self.step = [0] * SLOTS
        self.input = [NONE] * SLOTS
        for k, (step, done) in INPUT_FROM_STAGE.items():
            if k not in slot_of:
                continue
            (producer,) = [p for p in PRODUCERS[done] if p in slot_of]
            self.step[slot_of[k]] = step
            self.input[slot_of[k]] = step * microbatches * SLOTS + slot_of[producer] - slot_of[k]
        _, hops = input_tables(stages, microbatches, tuple(placement), with_comms=False)
        self.hop = [hops[k] if k is not None else [False] * stages for k in kinds]
        sign = signs(split)
        self.sign = [sign[k] if k is not None else 0 for k in kinds]


class CodeTables:
    """`SlotRules` spread over every search code of one problem, for the loops that price an
    order action by action: per code, the index of its local need and of its neighbour
    input in a table of finish times (`done`, the last index, finishes at 0 and stands for
    "waits for nothing"), the message time its input costs, its duration and what it adds
    to (+) or frees from (-) its rank's live activations."""

    __slots__ = ("done", "local", "input", "lag", "duration", "delta")

    def __init__(self, rules: SlotRules, microbatches: int, cost: Sequence[Sequence[float]], comm: float,
                 weight: Sequence[float]):
        stages = len(cost)
        n = stages * microbatches * SLOTS
        self.done = n
        self.local = [n] * n
        self.input = [n] * n
        self.lag = [0.0] * n
        self.duration = [0.0] * n
        self.delta = [0.0] * n
        for s in range(stages):
            for slot, kind in enumerate(rules.kind):
                if kind is None:
                    continue
                step = rules.step[slot]
                has_input = step != 0 and 0 <= s + step < stages
                lag = comm if rules.hop[slot][s] else 0.0
                for m in range(microbatches):
                    c = search_code(s * microbatches + m, slot)
                    if rules.local[slot] != NONE:
                        self.local[c] = c + rules.local[slot]
                    if has_input:
                        self.input[c] = c + rules.input[slot]
                        self.lag[c] = lag
                    self.duration[c] = cost[s][kind]
                    self.delta[c] = rules.sign[slot] * weight[s]
