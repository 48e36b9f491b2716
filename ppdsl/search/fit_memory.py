"""Memory actions placed to fit a limit: a schedule too big for it, with `R` or `OFFLOAD` and
`RELOAD` added so that it fits.

`fit(program, limit, how)` walks each rank's row in order under the checker's memory model (the
search's unit: a rank's whole share, a stage of v on a rank counting 1/v). Where an action
would take the rank past the limit, it evicts the live microbatches whose first backward comes
last in the row (Belady's rule: the one needed furthest ahead), until the action fits:

- `recompute`: the evicted microbatch's forward keeps only its input (an `R` runs it again
  just before its first backward, which the unit counts from the `R` on);
- `offload`: an `OFFLOAD` of it goes in right there, and its `RELOAD` one action before its
  first backward where the limit allows (so a copy lane can hide it), else just before.

Only a microbatch between its forward and its first backward can be evicted (an `I` keeps its
activations until its `W`). A row the rule cannot fit (the backwards it holds alone exceed the
limit), or one with overlapped pairs or batches, gives None. Each rank's order of computes is
unchanged and the new actions are the rank's own, so a program that could not hang still
cannot; `search` checks and prices what this returns all the same.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..ir import Action, Kind, Program, Step
from ..memory import EPSILON, rank_weights

HOW = ("recompute", "offload")
_BACKWARD = (Kind.B, Kind.I)


class _Row:
    """One rank's row being fitted: what is live on the device, and what waits to come back."""

    def __init__(self, row: Sequence[Action], weights: Sequence[float], limit: float, how: str):
        self.row = row
        self.weights = weights
        self.limit = limit
        self.how = how
        self.out: list[Step] = []
        self.live = 0.0
        self.movable: dict[tuple[int, int], float] = {}  # forward done, first backward not yet
        self.away: set[tuple[int, int]] = set()  # offloaded, or kept as input only: back before the backward
        self.first_back: dict[tuple[int, int], int] = {}
        for i, a in enumerate(row):
            key = (a.stage, a.microbatch or 0)
            if a.kind in _BACKWARD:
                self.first_back.setdefault(key, i)
        self.split = {(a.stage, a.microbatch or 0) for a in row if a.kind is Kind.I}

    def room(self, need: float, keep: tuple[int, int]) -> bool:
        """Evict until `need` more fits (never `keep`); False when nothing is left to evict."""
        while self.live + need > self.limit + EPSILON:
            movable = [k for k in self.movable if k != keep]
            if not movable:
                return False
            victim = max(movable, key=self.first_back.__getitem__)
            if self.how == "offload":
                self.out.append(Action(victim[0], Kind.OFFLOAD, victim[1]))
            self.live -= self.movable.pop(victim)
            self.away.add(victim)
        return True

    def back(self, key: tuple[int, int]) -> bool:
        """Bring `key` back on the device (its `RELOAD` or `R`)."""
        w = self.weights[key[0]]
        if not self.room(w, key):
            return False
        self.out.append(Action(key[0], Kind.RELOAD if self.how == "offload" else Kind.R, key[1]))
        self.away.discard(key)
        self.live += w
        return True

    def fitted(self) -> list[Step] | None:
        row, weights = self.row, self.weights
        for i, a in enumerate(row):
            key = (a.stage, a.microbatch or 0)
            w = weights[a.stage]
            if a.kind in _BACKWARD and key in self.away and not self.back(key):
                return None
            if a.kind is Kind.F:
                if not self.room(w, key):
                    return None
                self.live += w
                self.movable[key] = w
            elif a.kind in _BACKWARD:
                self.movable.pop(key, None)
                if a.kind is Kind.B and key not in self.split:
                    self.live -= w
            elif a.kind is Kind.W and key in self.split:
                self.live -= w
            self.out.append(a)
            self._prefetch(i)
        return self.out

    def _prefetch(self, i: int) -> None:
        """A reload one action early, where the limit allows it after the action that follows."""
        if self.how != "offload" or i + 2 >= len(self.row):
            return
        nxt, then = self.row[i + 1], self.row[i + 2]
        key = (then.stage, then.microbatch or 0)
        if then.kind not in _BACKWARD or key not in self.away or self.first_back[key] != i + 2:
            return
        if (nxt.stage, nxt.microbatch or 0) in self.away:
            return  # the action in between brings back its own first
        grows = self.weights[nxt.stage] if nxt.kind is Kind.F else 0.0
        w = self.weights[key[0]]
        if self.live + w + grows <= self.limit + EPSILON:
            self.out.append(Action(key[0], Kind.RELOAD, key[1]))
            self.away.discard(key)
            self.live += w


def fit(program: Program, limit: float, how: str) -> Program | None:
    """`program` with memory actions (`how`: "recompute" or "offload") that bring every rank
    within `limit` (in the search's unit), or None where the rule cannot (see the module)."""
    if how not in HOW:
        raise ValueError(f"how must be one of {', '.join(HOW)}, not {how!r}")
    weights = rank_weights(program.placement, program.ranks)
    rows: list[tuple[Step, ...]] = []
    for row in program.rows:
        if not all(type(step) is Action and step.microbatch is not None for step in row):
            return None
        actions = [step for step in row if type(step) is Action]
        if any(a.kind in (Kind.R, Kind.OFFLOAD, Kind.RELOAD) for a in actions):
            return None  # already placed by hand or by a generator: not ours to move
        fitted = _Row(actions, weights, limit, how).fitted()
        if fitted is None:
            return None
        rows.append(tuple(fitted))
    return Program(program.ranks, program.stages, program.microbatches, program.placement, tuple(rows))
