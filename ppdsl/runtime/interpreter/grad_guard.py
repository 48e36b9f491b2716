"""The guard against lost gradients: a parameter a stage's forward used ends the step with one.

A deferred weight gradient that never arrives leaves training silently wrong: the loss still
falls. So on the first training step the guard reads, from the autograd graph of each stage's
first forward, which of the stage's parameters it used, and at the end of every step it checks
that each of them holds a gradient; one that does not is a `StepError` naming the parameter,
the stage and the stage's last backward action. A `W` whose forward ran a split layer and that
computed nothing is refused where it runs (`schedule.py`).

What the graph does not show is not checked: parameters behind a reentrant checkpoint (its
node hides the graph inside). Parameters are named by their place in the stage and looked up
again at the check, so a wrapper that swaps parameter objects between the forward and the end
of the step (FSDP2: unsharded, then sharded) is checked on the ones the optimizer sees. A
gradient zeroed in place (`zero_grad(set_to_none=False)`) still counts as one, so after the
first step the check sees gradients that vanished, not zeros. Its cost is one graph walk per
stage on the first step and one look at each parameter after every step
(`benchmarks/bench_split_backward.py` and `bench_torch.py` time it);
`PipelineSchedule(grad_guard=False)` and `ppdsl run --no-grad-guard` turn it off.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import StepError
from ..framework import Framework


class GradGuard:
    def __init__(self, fw: Framework, layers: Mapping[int, Any], last_backward: Mapping[int, str], rank: int):
        self.fw = fw
        self.layers = layers
        self.last_backward = last_backward  # stage -> the label of its last backward action
        self.rank = rank
        self._used: dict[int, set[str]] = {}  # stage -> the names of the parameters its forward used

    def learn(self, stage: int, outputs: list[Any]) -> None:
        """Read which parameters a forward of `stage` used from its graph (once per stage)."""
        if stage in self._used or stage not in self.last_backward:
            return
        named = [(n, p) for n, p in self.fw.named_parameters(self.layers[stage]) if self.fw.needs_grad(p)]
        used = self.fw.used_parameters(outputs, [p for _, p in named])
        self._used[stage] = {n for (n, _), u in zip(named, used) if u}

    def check(self, step: int) -> None:
        """A `StepError` for the first used parameter that ended the step without a gradient."""
        for stage, used in sorted(self._used.items()):
            # Looked up by name now: a wrapper may hold other parameter objects during the
            # forward than after the step (FSDP2's unsharded ones, then the sharded ones).
            missing = [name for name, p in self.fw.named_parameters(self.layers[stage])
                       if name in used and self.fw.grad_of(p) is None]
            if missing:
                label = self.last_backward[stage]
                shown = ", ".join(f"`{n}`" for n in missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4
                                                                    else "")
                raise StepError(self.rank, step, label,
                                f"stage {stage}'s forward used {shown} but {'it has' if len(missing) == 1 else 'they have'}"
                                f" no gradient after {label}, the stage's last backward of the step: a gradient was "
                                "lost. Run with split_backward=False (--no-split-backward) to compare; "
                                "grad_guard=False (--no-grad-guard) turns this check off")
