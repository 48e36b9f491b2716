"""A backward split in two without doing any work twice: `I` now, the weight gradients at `W`.

Every plain Linear of a stage (`paddle.nn.Linear`, `torch.nn.Linear`) is switched to a matmul
with its own backward (a Paddle `PyLayer`, a torch `autograd.Function`: each framework's
adapter holds its own). That backward returns the
input gradient (and the bias gradient) at once and, instead of computing the weight gradient,
leaves the two tensors that make it (the layer's input and the gradient of its output) in a
`DeferredGrads` store under the (stage, microbatch) the interpreter is running. `W(s,m)` later
runs exactly that key's weight gradients (`weight.grad +=` the product, the way the framework's
own backward accumulates it) and drops the tensors.

So `I(s,m)` is one ordinary backward over the stage (it frees the graph) that also yields the
gradients of parameters that are not deferred (biases, norms, embeddings); `W(s,m)` is the
matmuls the backward left out. With no key set (a fused `B`, or autograd outside a schedule)
the weight gradient is computed on the spot, so a switched layer always gives the gradient
an unswitched one would (to float rounding): the parameters and the state dict do not change.

Paddle's own zero-bubble code (`fleet/meta_parallel/zero_bubble_utils.py`) keeps one global
queue of closures popped in order; a schedule's `W`s need not come in the order of its `I`s
and several stages share a process, hence the keyed store, one per `PipelineSchedule`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .framework import Framework

Key = tuple[int, int]

_SWITCHED = "_ppdsl_split_backward"  # set on a Linear whose forward was switched


class DeferredGrads:
    """Weight gradients left by `I` actions, keyed by (stage, microbatch)."""

    def __init__(self, framework: Framework | None = None) -> None:
        if framework is None:
            from .framework import get_framework

            framework = get_framework()
        self.framework = framework
        self.key: Key | None = None  # what the running backward defers under; None: compute now
        self._pending: dict[Key, list[tuple[Any, Any, Any]]] = {}

    def defer(self, weight: Any, x: Any, dy: Any) -> None:
        if self.key is None:
            self.framework.accumulate_weight_grad(weight, x, dy)
        else:
            self._pending.setdefault(self.key, []).append((weight, x, dy))

    def run(self, key: Key) -> int:
        """The weight gradients deferred under `key`, then forget their tensors; how many ran."""
        work = self._pending.pop(key, ())
        for weight, x, dy in work:
            self.framework.accumulate_weight_grad(weight, x, dy)
        return len(work)

    def holds(self, key: Key) -> bool:
        return key in self._pending

    def keys(self) -> Iterator[Key]:
        return iter(self._pending)

    def tensors(self, key: Key | None = None) -> Iterator[Any]:
        """The tensors the deferred gradients keep alive (inputs and output gradients), of
        one key or of all."""
        for work in self._pending.values() if key is None else [self._pending.get(key, [])]:
            for _, x, dy in work:
                yield x
                yield dy

    def clear(self) -> None:
        self._pending.clear()
        self.key = None




def switch_linears(stage: Any, store: DeferredGrads) -> tuple[list[str], list[str]]:
    """Switch every plain Linear inside `stage` to the split backward.

    Returns (names switched, names left as they were). A subclass that overrides `forward`
    computes something the split matmul does not know: it keeps its own forward, and its
    weight gradient comes with the input gradient in `I` (correct, just not deferred).
    """
    fw = store.framework
    linear = fw.linear_class()
    switched: list[str] = []
    kept: list[str] = []
    for name, sub in fw.sublayers(stage):
        if not isinstance(sub, linear):
            continue
        label = name or "(the stage itself)"
        if type(sub).forward is not linear.forward or ("forward" in vars(sub) and not getattr(sub, _SWITCHED, False)):
            kept.append(f"{label} ({type(sub).__name__})")
            continue
        object.__setattr__(sub, "forward", fw.split_forward(sub, store))
        object.__setattr__(sub, _SWITCHED, True)
        switched.append(label)
    return switched, kept


def restore_linears(stage: Any) -> None:
    """Undo `switch_linears`: every switched Linear gets its class's forward back."""
    from .framework import framework_of

    for _, sub in framework_of(stage).sublayers(stage):
        if getattr(sub, _SWITCHED, False):
            del sub.__dict__["forward"]
            object.__setattr__(sub, _SWITCHED, False)
