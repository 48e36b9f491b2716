"""Tied parameters: parameters of different stages that are one (GPT-2's token embedding and
LM head), held as one copy per stage.

A stage layer declares its tied parameters in an attribute, `ppdsl_tied = {parameter name:
tie name}`; parameters of any stages that give the same tie name are one. At set-up every copy
takes the value of the copy on the lowest stage (as DDP broadcasts a model's weights). Each
copy's gradient becomes the sum over the copies: added on the rank when two stages of one rank
hold it (V placements: nothing is sent), all-reduced over the ranks that hold it otherwise (one
group per tie, made once). The sum is part of each holding stage's `REDUCE_GRAD`, where the
schedule shows it: it starts there, beside compute, and the step's end waits for it. The
optimizer then moves every copy alike, so the copies stay equal.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from attrs import frozen

from ..errors import SetupError
from ..framework import Framework
from ..jobs.watchdog import Lane
from ..transport.background import Background
from .reduction import CLOSE_SECONDS, lost

ATTRIBUTE = "ppdsl_tied"


@frozen
class Copy:
    """One copy of a tie: its stage, its parameter's name there, its shape and dtype."""

    tie: str
    stage: int
    name: str
    shape: tuple[int, ...]
    dtype: str


def declared(fw: Framework, layers: Mapping[int, Any]) -> list[Copy]:
    """The copies the stage layers declare, in stage order (SetupError for a malformed
    declaration, or one naming a parameter the layer does not have)."""
    out: list[Copy] = []
    for s, layer in sorted(layers.items()):
        ties = getattr(layer, ATTRIBUTE, None)
        if ties is None:
            continue
        if not isinstance(ties, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in ties.items()):
            raise SetupError(f"stage {s}: `{ATTRIBUTE}` must be a dict of parameter name -> tie name, e.g. "
                             "{'tokens.weight': 'embedding'}")
        params = dict(fw.named_parameters(layer))
        for name, tie in sorted(ties.items()):
            p = params.get(name)
            if p is None:
                known = ", ".join(sorted(params)[:6]) or "none"
                raise SetupError(f"stage {s}: `{ATTRIBUTE}` names {name!r}, which is not one of its parameters "
                                 f"({known}{', ...' if len(params) > 6 else ''})")
            out.append(Copy(tie, s, name, tuple(fw.shape(p)), fw.dtype_name(p)))
    return out


def check(copies: list[Copy]) -> dict[str, list[Copy]]:
    """tie -> its copies, in stage order; SetupError for a tie one stage declares alone or
    whose copies differ in shape or dtype."""
    ties: dict[str, list[Copy]] = {}
    for c in sorted(copies, key=lambda c: (c.tie, c.stage, c.name)):
        ties.setdefault(c.tie, []).append(c)
    for tie, cs in ties.items():
        if len(cs) < 2:
            raise SetupError(f"tie {tie!r} is declared by stage {cs[0].stage}'s {cs[0].name} alone: a tie joins "
                             "parameters of two or more stages (or two of one stage)")
        first = cs[0]
        for c in cs[1:]:
            if (c.shape, c.dtype) != (first.shape, first.dtype):
                raise SetupError(f"tie {tie!r}: stage {first.stage}'s {first.name} is {first.dtype} "
                                 f"{list(first.shape)} but stage {c.stage}'s {c.name} is {c.dtype} {list(c.shape)}: "
                                 "tied parameters must have one shape and dtype")
    return ties


class LocalTies:
    """The copies this rank holds, by tie, as parameters; sums and equalizes them on the rank."""

    def __init__(self, fw: Framework, layers: Mapping[int, Any], ties: Mapping[str, list[Copy]]):
        self.fw = fw
        self.params: dict[str, list[Any]] = {}
        self.owners: dict[str, bool] = {}  # whether the tie's lowest-stage copy is here
        for tie, cs in ties.items():
            here = [c for c in cs if c.stage in layers]
            if here:
                named = {c.stage: dict(fw.named_parameters(layers[c.stage])) for c in here}
                self.params[tie] = [named[c.stage][c.name] for c in here]
                self.owners[tie] = cs[0].stage in layers

    def ids(self) -> set[int]:
        """ids of every copy this rank holds."""
        return {id(p) for ps in self.params.values() for p in ps}

    def others(self) -> set[int]:
        """ids of every copy but the lowest-stage one of each tie (a norm counts a tie once)."""
        return {id(p) for tie, ps in self.params.items() for p in (ps[1:] if self.owners[tie] else ps)}

    def value(self, tie: str, give: bool = True) -> Any:
        """The owner's value (zeros where it is on another rank, or not `give`), as one flat tensor."""
        ps = self.params[tie]
        return self.fw.flatten([self.fw.detach(ps[0]) if give and self.owners[tie] else self.fw.zeros_like(ps[0])])

    def grad_sum(self, tie: str) -> Any:
        """The sum of this rank's copies' gradients, in stage order, as one flat tensor."""
        fw = self.fw
        grads = [g if (g := fw.grad_of(p)) is not None else fw.zeros_like(p) for p in self.params[tie]]
        total = fw.flatten([grads[0]])
        for g in grads[1:]:
            total = total + fw.flatten([g])  # both frameworks' tensors add so
        return total

    def set_values(self, tie: str, flat: Any) -> None:
        for p in self.params[tie]:
            self.fw.unflatten_into(flat, [p], 1.0)

    def set_grads(self, tie: str, flat: Any) -> None:
        """Each copy's gradient becomes `flat` (a copy its forward left without one keeps none:
        the guard against lost gradients names it)."""
        for p in self.params[tie]:
            g = self.fw.grad_of(p)
            if g is not None:
                self.fw.unflatten_into(flat, [g], 1.0)


def equalize(local: LocalTies, all_reduce: Callable[[str, Any], None] | None = None, give: bool = True) -> None:
    """Every copy takes its tie's lowest-stage value: over the ranks that hold copies,
    `all_reduce(tie, flat)` sums what each gives (the owner's value where `give`, else zeros)."""
    for tie in sorted(local.params):
        flat = local.value(tie, give)
        if all_reduce is not None:
            all_reduce(tie, flat)
        local.set_values(tie, flat)


def equalize_local(fw: Framework, layers: Mapping[int, Any]) -> LocalTies:
    """Every tie of `layers` (all stages of a model, one process: `--verify`'s reference) takes
    its lowest stage's value."""
    local = LocalTies(fw, layers, check(declared(fw, layers)))
    equalize(local)
    return local


def sum_local(local: LocalTies) -> None:
    """Each copy's gradient becomes the sum over the copies (all on this process)."""
    for tie in local.params:
        local.set_grads(tie, local.grad_sum(tie))


class TiedParameters:
    """The ties of a job, for one rank: its copies, and per tie the group of every rank, over
    all replicas, that holds one (none where this rank is the only one).

    A tie's sum starts once every local stage holding one of its copies has finished its
    gradients (`stage_done`: at the stage's `REDUCE_GRAD`, or after its last backward where
    the file places none), on a thread beside compute; `wait` (the end of the step) writes it
    into every copy. Over replicas the group's sum counts each replica's copies, so the mean
    over replicas is taken here and the replicas' own average leaves tied copies alone
    (`skip`). A rank posts its ties in the order of their names, whatever order its stages
    finish in: each tie's collective has a group of its own, and one order on every rank is
    what keeps two ranks that share two ties from waiting on each other."""

    def __init__(self, fw: Framework, layers: Mapping[int, Any], ties: Mapping[str, list[Copy]],
                 holders: Mapping[str, list[int]], rank: int, replica: int, replicas: int,
                 group: Callable[[list[int]], Any], all_reduce: Callable[[Any, Any], None], lane: Lane,
                 early: bool = True):
        self.local = LocalTies(fw, layers, ties)
        # On a GPU a collective makes the posting thread's stream wait for every member, and a
        # tie joins stages that reach it far apart: started early it would hold up the rank's
        # later kernels (sends its peers wait for). There the sums run at the step's end.
        self.early = early
        self.all_reduce = all_reduce
        self.replicas = replicas
        self.groups: dict[str, Any] = {}
        self.ranks: dict[str, list[int]] = {}
        for tie in sorted(holders):  # every process makes every group, in one order
            ranks = holders[tie]
            if len(ranks) > 1:
                g = group(ranks)
                if rank in ranks:
                    self.groups[tie], self.ranks[tie] = g, ranks
        self.order = sorted(self.local.params)
        self.stages = {tie: {c.stage for c in ties[tie] if c.stage in layers} for tie in self.order}
        self.background = Background("tied-reduce", lane)
        self._done: set[int] = set()
        self.posted = 0  #: ties started this step: a prefix of `order`
        self._sums: dict[str, Any] = {}

        # Replica 0's owner alone gives the value: a sum over replicas would not be it.
        equalize(self.local, self._collective, give=replica == 0)

    def _collective(self, tie: str, flat: Any) -> None:
        if tie in self.groups:
            self.all_reduce(self.groups[tie], flat)

    def stage_done(self, stage: int) -> None:
        """Stage `stage`'s gradients are final on this rank: start every tie whose local
        copies are all final now (in name order)."""
        self._done.add(stage)
        if self.early:
            self._post(lambda tie: self.stages[tie] <= self._done)

    def _post(self, ready: Callable[[str], bool]) -> None:
        while self.posted < len(self.order) and ready(tie := self.order[self.posted]):
            self.posted += 1
            flat = self._sums[tie] = self.local.grad_sum(tie)
            if tie in self.groups:
                label = f"summing tied parameters {tie!r} with ranks {', '.join(map(str, self.ranks[tie]))}"

                def job(lane: Lane | None, tie: str = tie, flat: Any = flat, label: str = label) -> None:
                    doing = f"all-reducing with ranks {', '.join(map(str, self.ranks[tie]))}"
                    if lane is not None:
                        lane.arm(label, doing)
                    try:
                        self._collective(tie, flat)
                    except RuntimeError as exc:
                        raise lost("a rank holding a tied copy", doing, exc) from None

                self.background.post(job, label)

    def wait(self) -> None:
        """Every tie summed (one not started yet starts now): each copy's gradient is the sum
        over the copies, averaged over replicas. Raises `JobFailed` when a sum failed."""
        self._post(lambda tie: True)
        self.background.wait()
        scale = 1.0 / self.replicas
        for tie, flat in self._sums.items():
            self.local.set_grads(tie, flat * scale if self.replicas > 1 else flat)
        self.reset()

    def reset(self) -> None:
        """Nothing started (a step's start: one that failed may have left some)."""
        self._sums.clear()
        self._done.clear()
        self.posted = 0

    def close(self) -> None:
        self.background.join(CLOSE_SECONDS)
