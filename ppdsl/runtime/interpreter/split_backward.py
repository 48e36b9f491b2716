"""A backward split in two without doing any work twice: `I` now, the weight gradients at `W`.

While a step runs, every eligible Linear of a stage (`paddle.nn.Linear`, `torch.nn.Linear`)
computes through a matmul with its own backward (a Paddle `PyLayer`, a torch
`autograd.Function`: each framework's adapter holds its own). That backward returns the input
gradient (and the bias gradient) at once and, instead of computing the weight gradient, leaves
the two tensors that make it (the layer's input and the gradient of its output) in a
`DeferredGrads` store under the (stage, microbatch) the interpreter is running. `W(s,m)` later
runs exactly that key's weight gradients (`weight.grad +=` the product, the way the
framework's own backward accumulates it) and drops the tensors. With no key set (a fused `B`)
the weight gradient is computed on the spot. A large Paddle `Embedding` defers the same way
(its ids and output gradient, `W` adds the rows). On PyTorch the other weights of a stage are
deferred on the autograd graph itself (`GraphSplit` here, the adapter's `graph_split.py`).

The switch is made when a step starts and undone when it ends (`SplitLinears.active`), so
between steps, after `close()` and in the user's own code the modules are exactly theirs:
they pickle, their `state_dict` and their forward are unchanged.

The deferred product is the one the framework's Linear backward computes, in every context a
Linear meets: the gradient goes to the layer's parameter object itself (a checkpoint's
recomputation saves a detached copy of the weight, which must not decide anything), under
autocast the product is taken in the autocast dtype and cast back as autograd's cast node
would, and a call whose weight is not a leaf parameter or needs no gradient runs the plain
Linear. A layer whose gradient something else must see when `I` ends (a DTensor weight, so
FSDP2 or tensor parallelism; a module under FSDP) is not switched: its weight gradient comes
with `I`, exact, just not deferred. `SplitLinears.report()` says which path each stage took.

Paddle's own zero-bubble code (`fleet/meta_parallel/zero_bubble_utils.py`) keeps one global
queue of closures popped in order; a schedule's `W`s need not come in the order of its `I`s
and several stages share a process, hence the keyed store, one per `PipelineSchedule`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ..framework import Framework

Key = tuple[int, int]

#: An embedding table smaller than this (elements) keeps its gradient in `I`: its backward is
#: a scatter into a zeroed table, which at this size costs less than deferring it does (on
#: PyTorch the graph walk, a few microseconds per node of the stage's graph each microbatch).
EMBEDDING_MIN = 1 << 20


class DeferredGrads:
    """Weight gradients left by `I` actions, keyed by (stage, microbatch)."""

    def __init__(self, framework: Framework | None = None) -> None:
        if framework is None:
            from ..framework import get_framework

            framework = get_framework()
        self.framework = framework
        self.key: Key | None = None  # what the running backward defers under; None: compute now
        self._pending: dict[Key, list[tuple[Any, Any, Any, Any]]] = {}
        self._calls: dict[Key, Callable[[], int]] = {}  # the graph split's W, keyed as the products
        self._forwarded: set[Key] = set()  # keys whose forward ran a switched layer

    def defer(self, weight: Any, x: Any, dy: Any, accumulate: Callable[[Any, Any, Any], None] | None = None) -> None:
        """`weight` is the layer's parameter itself, never a saved copy of it; `accumulate`
        adds the product (None: a Linear's, `x^T dy`, as the framework's adapter adds it)."""
        if self.key is None:
            (accumulate or self.framework.accumulate_weight_grad)(weight, x, dy)
        else:
            self._pending.setdefault(self.key, []).append((weight, x, dy, accumulate))

    def defer_call(self, key: Key, call: Callable[[], int]) -> None:
        """The rest of `key`'s backward on the autograd graph (`graph_split.py`), for its `W`."""
        self._calls[key] = call

    def forwarded(self) -> None:
        """A switched layer ran under the current key: its `W` must find work."""
        if self.key is not None:
            self._forwarded.add(self.key)

    def expects(self, key: Key) -> bool:
        """Whether the forward of `key` ran a switched layer (so its `W` has work to do)."""
        return key in self._forwarded

    def run(self, key: Key) -> int:
        """The weight gradients deferred under `key`, then forget their tensors; how many ran."""
        work = self._pending.pop(key, ())
        self._forwarded.discard(key)
        linear = self.framework.accumulate_weight_grad
        for weight, x, dy, accumulate in work:
            (accumulate or linear)(weight, x, dy)
        call = self._calls.pop(key, None)
        return len(work) + (call() if call is not None else 0)

    def holds(self, key: Key) -> bool:
        return key in self._pending or key in self._calls

    def keys(self) -> Iterator[Key]:
        """Keys with work waiting (a key whose graph the split keeps counts as a live graph)."""
        return iter(set(self._pending) | set(self._calls))

    def tensors(self, key: Key | None = None) -> Iterator[Any]:
        """The tensors the deferred gradients keep alive (inputs and output gradients), of
        one key or of all."""
        for work in self._pending.values() if key is None else [self._pending.get(key, [])]:
            for _, x, dy, _ in work:
                yield x
                yield dy

    def clear(self) -> None:
        self._pending.clear()
        self._calls.clear()
        self._forwarded.clear()
        self.key = None


class SplitLinears:
    """The Linears of a rank's stages whose weight gradients are deferred to `W`.

    Chosen once, when the schedule is built; switched in only inside `active()`. `kept` holds,
    per stage, the Linears left as they are, grouped by why."""

    def __init__(self, layers: Mapping[int, Any], store: DeferredGrads) -> None:
        self.store = store
        self.switched: dict[int, list[tuple[str, Any]]] = {}
        self.kept: dict[int, dict[str, list[str]]] = {}  # stage -> reason -> "name (Class)"
        fw = store.framework
        #: Per stage with weights the autograd graph defers (`GraphSplit`).
        self.graphs: dict[int, GraphSplit] = {}
        for s, stage in sorted(layers.items()):
            switched, kept = self.switched.setdefault(s, []), self.kept.setdefault(s, {})
            linears = list(eligible_linears(fw, stage))
            switched.extend((name or "(the stage itself)", sub) for name, sub, reason in linears if not reason)
            switched.extend(fw.split_embeddings(stage))
            found = fw.graph_weights(stage, [sub for _, sub in switched])
            on_graph = {id(p) for _, p, _ in found}
            for name, sub, reason in linears:
                # A Linear the split matmul cannot take whose weight the graph defers is not kept.
                if reason and not any(id(p) in on_graph for _, p in fw.named_parameters(sub)):
                    kept.setdefault(reason, []).append(f"{name or '(the stage itself)'} ({type(sub).__name__})")
            if found:
                deferred = [p for _, p, _ in found]
                eager = [p for p in fw.trainable(stage) if id(p) not in on_graph]
                self.graphs[s] = GraphSplit(s, deferred, eager, [f"{name} ({cls})" for name, _, cls in found])
        self._forwards = [(sub, fw.split_forward(sub, store)) for subs in self.switched.values() for _, sub in subs]

    @contextmanager
    def active(self) -> Iterator[None]:
        """The switched forwards in place for the duration; the modules' own afterwards."""
        done: list[Any] = []
        try:
            for sub, forward in self._forwards:
                object.__setattr__(sub, "forward", forward)
                done.append(sub)
            yield
        finally:
            for sub in done:
                vars(sub).pop("forward", None)

    def warnings(self) -> list[str]:
        """One line per stage and reason a Linear is kept."""
        return [f"stage {s}: {_kept(labels, reason)}" for s, kept in sorted(self.kept.items())
                for reason, labels in kept.items()]

    def report(self) -> dict[int, str]:
        """Per stage, in words: which path its weight gradients take."""
        out = {}
        for s, switched in self.switched.items():
            kept = "; ".join(_kept(labels, reason) for reason, labels in self.kept[s].items())
            graph = self.graphs.get(s)
            on_graph = graph.describe() if graph is not None else ""
            if switched or (graph is not None and graph.active):
                parts = [f"the weight gradients of {_layers(self.store.framework, switched)} deferred to W"] if switched else []
                parts += [on_graph] if on_graph else []
                out[s] = "split: " + "; ".join(parts + ([kept] if kept else []))
            else:
                why = "; ".join(x for x in (kept, on_graph) if x)
                out[s] = f"whole: every weight gradient computed in I{f' ({why})' if why else ', no weight to defer'}"
        return out


class GraphSplit:
    """A stage's weights deferred on the autograd graph (the framework's `backward_split`): what
    it defers, what it finishes in `I`, the weights its first backward found not worth
    deferring (moved to `I`, with why), and, once a backward was refused, why (from then on the
    stage's `I` runs the whole backward)."""

    def __init__(self, stage: int, deferred: list[Any], eager: list[Any], labels: list[str]):
        self.stage = stage
        self.deferred = deferred
        self.eager = eager
        self.labels = labels  # of `deferred`, in its order
        self.moved: dict[str, list[str]] = {}  # why -> labels of weights moved to I
        self.refused: str | None = None

    def refuse(self, why: str) -> str:
        """Turn the split off for this stage; the warning to give, once."""
        self.refused = why
        return (f"stage {self.stage}: the weight gradients of {', '.join(self.labels)} are computed in I: "
                f"the backward's graph cannot be split exactly ({why})")

    def keep_in_i(self, weights: list[Any], nodes: list[str]) -> None:
        """Finish `weights` in `I` from now on: their backward nodes (`nodes`) compute the input
        and weight gradients together, so a deferred weight would cost its input gradient twice."""
        ids = {id(w) for w in weights}
        why = (f"computed in I: {'its' if len(weights) == 1 else 'their'} backward ({', '.join(nodes)}) makes the "
               "input and weight gradients together")
        kept = [(w, label) for w, label in zip(self.deferred, self.labels) if id(w) not in ids]
        self.moved.setdefault(why, []).extend(label for w, label in zip(self.deferred, self.labels) if id(w) in ids)
        self.eager = self.eager + [w for w in self.deferred if id(w) in ids]
        self.deferred = [w for w, _ in kept]
        self.labels = [label for _, label in kept]

    @property
    def active(self) -> bool:
        return self.refused is None and bool(self.deferred)

    def describe(self) -> str:
        parts = []
        if self.refused is not None:
            parts.append(f"{', '.join(self.labels)} computed in I: the graph cannot be split exactly ({self.refused})")
        elif self.labels:
            parts.append(f"the weight gradients of {', '.join(self.labels)} deferred to W on the autograd graph")
        parts += [f"{', '.join(labels)} {why}" for why, labels in self.moved.items()]
        return "; ".join(parts)


def _kept(labels: list[str], reason: str) -> str:
    if len(labels) == 1:
        return f"layer {labels[0]} {reason}"
    return f"layers {', '.join(labels)} {_plural_reason(reason)}"


def _plural_reason(reason: str) -> str:
    """The reason as said of several layers."""
    for one, many in (("overrides", "override"), ("has a", "have a"), ("is inside", "are inside"),
                      ("its weight gradient", "their weight gradients"), ("its gradient", "their gradients"),
                      ("whose gradient is", "whose gradients are"), ("it is computed", "they are computed")):
        reason = reason.replace(one, many)
    return reason


def _count(items: list[Any], noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def _layers(fw: Framework, switched: list[tuple[str, Any]]) -> str:
    """"2 Linears", or "2 Linears and 1 Embedding": the switched layers by kind."""
    linear = fw.linear_class()
    linears = [sub for _, sub in switched if isinstance(sub, linear)]
    others = [sub for _, sub in switched if not isinstance(sub, linear)]
    said = [_count(linears, "Linear")] if linears else []
    return " and ".join(said + ([_count(others, "Embedding")] if others else []))


OVERRIDES = ("overrides Linear.forward, so its weight gradient cannot be deferred to W; it is computed with the "
             "input gradient in I")


def eligible_linears(fw: Framework, stage: Any) -> Iterator[tuple[str, Any, str]]:
    """(name, layer, why it is kept or "") for each Linear inside `stage`."""
    linear = fw.linear_class()
    for name, sub in fw.sublayers(stage):
        if not isinstance(sub, linear):
            continue
        if type(sub).forward is not linear.forward or "forward" in vars(sub):
            yield name, sub, OVERRIDES
            continue
        yield name, sub, fw.unsplittable(stage, name, sub)
