"""PyTorch's split on the autograd graph: the weight gradients of any layer deferred to `W`.

The split Linear (`split.py`) covers `torch.nn.Linear`. The other weights a stage defers (a
large `Embedding`, a Linear that overrides its forward, `x @ self.weight`) are split here, on
the graph the forward built. Two sets of leaves: the stage's input and the parameters finished
in `I` (`eager`: the split Linears' own, whose deferral happens inside `I`'s backward, and
whatever the caller keeps whole), and the `deferred` weights. Nodes that lead to the first set
run in `I`; nodes that lead only to deferred weights are `W`'s part. Where the two parts meet,
one of two things carries the gradient across:

- a *fork*: a node `I` runs whose edge into `W`'s part goes straight to a weight (through
  transposes and casts at most), as a matrix product's backward. `I` asks that node for its
  input-side outputs only, and a pre-hook keeps the gradients it received; `W` feeds them back
  in, asking for the weight: the node runs again for the weight output. Only nodes whose weight
  output is a kernel of its own are worth it (`_SEPARATE`); any other fork's weights are
  finished in `I` (`SplitCostly`, before any work).
- a *branch*: a node of `W`'s part that does work of its own (an `Embedding`'s backward, a
  whole sub-network only the weights need). `I` asks for the gradient flowing into it
  (`autograd.grad` on a `GradientEdge`, which stops there) and `W` starts from it.

So I + W cost one backward, plus one engine call per fork in `W`. The graph is kept
(`retain_graph`) from `I` to `W`, as PyTorch's own `stage_backward_input` /
`stage_backward_weight` keep it.

The split is exact or not taken: a leaf that is none of the stage's known tensors, a hook on
a parameter finished in `I` (`I`'s gradients are added by hand, as autograd adds them, without
hooks), or a deferred weight that a fork also reaches through `I`'s part (its gradient would be
counted twice): `SplitRefused`, with the reason, before anything is computed, and the caller
runs the whole backward in `I`. A forward that hooks an activation is refused by the caller
(`hooks_registered`), since a fork's second call would run the hook again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch.autograd.graph import GradientEdge

from ..framework import SplitCostly, SplitRefused


# Backward nodes whose weight gradient is a kernel of its own, skipped when not asked for: a
# fork of one of these costs, in `I` and `W` together, what one call costs. Another node as a
# fork (a convolution's CPU backward computes its input gradient at about 88% of the whole; a
# user's `Function` rarely reads `needs_input_grad`) would compute its input gradient twice:
# its weights are finished in `I` (`SplitCostly`).
_SEPARATE = frozenset({"MmBackward0", "AddmmBackward0", "BmmBackward0", "BaddbmmBackward0", "AddbmmBackward0"})

# Backward nodes that only move or cast a gradient: a chain of them from a node to a weight
# leaves the weight's cost in that node, which then runs again in `W` (a fork).
_MOVES = frozenset({"TBackward0", "ToCopyBackward0", "ViewBackward0", "UnsafeViewBackward0", "ReshapeAliasBackward0",
                    "TransposeBackward0", "TransposeBackward1", "PermuteBackward0", "AliasBackward0",
                    "UnsqueezeBackward0", "SqueezeBackward0", "SqueezeBackward1", "SqueezeBackward4",
                    "CloneBackward0", "ExpandBackward0", "AsStridedBackward0"})


class _Graph:
    """One walk of the graph, children before parents (iterative: graphs are deep), placing
    each node: whether it leads to `I`'s leaves (`now`), which deferred weights it reaches (a
    bit per weight), whether it is a cheap way down to one weight; and from those the
    branches (node -> the input slots the graph feeds) and the forks (node, the weights its
    second call owns, the weights its other edges reach)."""

    def __init__(self, roots: Sequence[Any], finished: Sequence[Any], deferred: Sequence[Any]):
        now_ids = {id(t) for t in finished}
        bit = {id(w): 1 << i for i, w in enumerate(deferred)}
        now: dict[Any, bool] = {}
        reach: dict[Any, int] = {}
        cheap: dict[Any, bool] = {}  # a weight itself, or a chain of `_MOVES` to one
        heavy: dict[Any, bool] = {}  # a W-only node with work of its own, or above one
        self.now, self.reach, self.cheap = now, reach, cheap
        self.now_leaves: list[Any] = []
        self.branches: dict[Any, set[int]] = {}
        self.forks: list[tuple[Any, int, int]] = []
        seen: set[Any] = set()
        for root in roots:
            if root in seen:
                continue
            seen.add(root)
            stack: list[tuple[Any, list[tuple[Any, int]], int]] = [(root, _edges(root), 0)]
            while stack:
                node, edges, i = stack[-1]
                while i < len(edges) and edges[i][0] in seen:
                    i += 1
                if i < len(edges):
                    child = edges[i][0]
                    seen.add(child)
                    stack[-1] = (node, edges, i + 1)
                    stack.append((child, _edges(child), 0))
                    continue
                stack.pop()
                self._place(node, edges, now_ids, bit, heavy)

    def _place(self, node: Any, edges: list[tuple[Any, int]], now_ids: set[int], bit: dict[int, int],
               heavy: dict[Any, bool]) -> None:
        now, reach, cheap = self.now, self.reach, self.cheap
        var = getattr(node, "variable", None)  # an AccumulateGrad: a leaf
        if var is not None:
            if id(var) in now_ids:
                now[node], reach[node] = True, 0
                self.now_leaves.append(var)
            elif id(var) in bit:
                now[node], reach[node] = False, bit[id(var)]
            else:
                raise SplitRefused(f"its graph reaches a tensor that is neither the stage's input nor one of "
                                   f"its parameters (shape {tuple(var.shape)}, {var.dtype})")
            cheap[node], heavy[node] = True, False
            return
        n, r, below = False, 0, False
        for child, _ in edges:
            n = n or now[child]
            r |= reach[child]
            below = below or heavy[child]
        now[node], reach[node] = n, r
        cheap[node] = len(edges) == 1 and cheap[edges[0][0]] and node.name() in _MOVES
        w_only = not n and r != 0
        heavy[node] = w_only and not cheap[node]
        if heavy[node] and not below:
            self.branches[node] = set()
        if not (n or heavy[node]) or node in self.branches:
            return  # runs in W only (or not at all)
        owned = other = 0
        branches = self.branches
        for child, slot in edges:
            if child in branches:
                branches[child].add(slot)
                other |= reach[child]
            elif not now[child] and reach[child] and cheap[child]:
                owned |= reach[child]
            else:
                other |= reach[child]
        if owned:
            if owned & other:
                raise SplitRefused("a weight it defers is reached both beside and below a node the input gradient "
                                   "runs through (one weight used twice along a path)")
            self.forks.append((node, owned, other))

    def w_only(self, node: Any) -> bool:
        return not self.now[node] and self.reach[node] != 0


def _edges(node: Any) -> list[tuple[Any, int]]:
    return [(c, k) for c, k in node.next_functions if c is not None]


def backward_input(outs: Sequence[Any], grads: Sequence[Any] | None, inputs: Sequence[Any], eager: Sequence[Any],
                   deferred: Sequence[Any]) -> tuple[list[Any | None], Callable[[], int] | None]:
    """`I`: the gradients of `inputs` (returned) and of `eager` (added to their `.grad`) now,
    those of `deferred` left to the returned `W` (None when none is reached: all is done).
    `W` returns how many deferred weights it reached. Raises `SplitRefused` before computing
    anything when the split would not be exact."""
    for p in eager:
        if p._backward_hooks or p._post_accumulate_grad_hooks:
            raise SplitRefused("a parameter it finishes in I has a gradient hook, which the split would not call")
    if grads is None:
        grads = [torch.ones_like(t) for t in outs]
    graph = _Graph([t.grad_fn for t in outs if t.grad_fn is not None], list(inputs) + list(eager), deferred)
    # Outputs that lead straight to a weight: their gradient is the one given.
    direct = [(torch.autograd.graph.get_gradient_edge(t), g) for t, g in zip(outs, grads)
              if t.grad_fn is not None and graph.w_only(t.grad_fn) and graph.cheap[t.grad_fn]]
    branches, forks = graph.branches, graph.forks
    costly = [(node.name(), owned) for node, owned, _ in forks if node.name() not in _SEPARATE]
    if costly:
        bits = 0
        for _, owned in costly:
            bits |= owned
        raise SplitCostly([w for i, w in enumerate(deferred) if bits >> i & 1], sorted({n for n, _ in costly}))
    if not forks and not branches and not direct:
        return _whole(outs, grads, inputs), None
    received: dict[int, tuple[Any, ...]] = {}
    handles = [node.register_prehook(_keeper(received, i)) for i, (node, _, _) in enumerate(forks)]
    edges = [GradientEdge(node, k) for node, slots in branches.items() for k in sorted(slots)]
    input_ids = {id(x) for x in inputs}
    leaves = [t for t in graph.now_leaves if id(t) not in input_ids]
    try:
        asked = list(inputs) + leaves + edges
        found = list(_engine(list(outs), list(grads), asked, keep=True, accumulate=False)) if asked else []
    finally:
        for handle in handles:
            handle.remove()
    input_grads = found[:len(inputs)]
    _accumulate(leaves, found[len(inputs):len(inputs) + len(leaves)])
    roots = direct + [(e, g) for e, g in zip(edges, found[len(inputs) + len(leaves):]) if g is not None]
    branch_reach = 0
    for e, _ in roots:
        branch_reach |= graph.reach[e.node]
    batches = _batches(roots, branch_reach, forks, received)
    return input_grads, lambda: _backward_weight(batches, list(deferred))


def _engine(roots: list[Any], grads: list[Any], inputs: list[Any], *, keep: bool, accumulate: bool) -> tuple[Any, ...]:
    """Autograd's engine on `roots` (tensors or `GradientEdge`s) with their gradients given:
    `accumulate`, into `inputs`' `.grad` as `backward(inputs=...)`; else their gradients
    returned as `grad(..., allow_unused=True)`. Straight to the engine: the Python wrappers
    check each gradient's shape symbolically, ten times the engine's own cost for a
    `GradientEdge` (255 us against 22 us a call, measured), and `W` makes one call a fork."""
    run = getattr(getattr(torch.autograd, "graph", None), "_engine_run_backward", None)
    if run is None:  # pragma: no cover - a torch without it: the public calls, same result
        if accumulate:
            torch.autograd.backward(roots, grads, inputs=inputs, retain_graph=keep)
            return ()
        found: tuple[Any, ...] = torch.autograd.grad(roots, inputs, grad_outputs=grads, retain_graph=keep,
                                                     allow_unused=True)
        return found
    out: tuple[Any, ...] = run(tuple(roots), tuple(grads), keep, False, tuple(inputs), True, accumulate)
    return out


def _whole(outs: Sequence[Any], grads: Sequence[Any], inputs: Sequence[Any]) -> list[Any | None]:
    """Nothing to defer: one backward, as autograd runs it."""
    torch.autograd.backward(list(outs), list(grads))
    return [x.grad for x in inputs]


def _accumulate(params: list[Any], grads: list[Any | None]) -> None:
    """What autograd's AccumulateGrad does with new gradients (hooks refused before): the first
    is kept as it is, later ones are added in place."""
    into, adds = [], []
    with torch.no_grad():
        for p, g in zip(params, grads):
            if g is None:
                continue
            if p.grad is None:
                p.grad = g
            else:
                into.append(p.grad)
                adds.append(g)
        if into:
            torch._foreach_add_(into, adds)


def _keeper(received: dict[int, tuple[Any, ...]], i: int) -> Callable[[tuple[Any, ...]], None]:
    def keep(grad_outputs: tuple[Any, ...]) -> None:
        received[i] = grad_outputs

    return keep


Batch = tuple[list[Any], list[Any], int]  # root edges, their gradients, weights asked for


def _batches(roots: list[tuple[Any, Any]], roots_reach: int, forks: list[tuple[Any, int, int]],
             received: dict[int, tuple[Any, ...]]) -> list[Batch]:
    """The backward calls `W` makes. Branch roots never reach `I`'s part, so they go together;
    a fork joins a call only if no root of the call reaches a weight the call asks for through
    an edge whose gradient came with another root (it would be counted twice)."""
    out: list[Batch] = []
    edges = [e for e, _ in roots]
    grads = [g for _, g in roots]
    asked, below = roots_reach, 0
    for i, (node, owned, other) in enumerate(forks):
        got = [(GradientEdge(node, k), g) for k, g in enumerate(received.get(i, ())) if g is not None]
        if not got:
            continue
        if edges and (asked | owned) & (below | other):
            out.append((edges, grads, asked))
            edges, grads, asked, below = [], [], 0, 0
        edges.extend(e for e, _ in got)
        grads.extend(g for _, g in got)
        asked |= owned
        below |= other
    if edges:
        out.append((edges, grads, asked))
    return out


def _backward_weight(batches: list[Batch], weights: list[Any]) -> int:
    reached = 0
    for i, (edges, grads, asked) in enumerate(batches):
        targets = [w for b, w in enumerate(weights) if asked >> b & 1]
        _engine(edges, grads, targets, keep=i < len(batches) - 1, accumulate=True)
        reached |= asked
    batches.clear()
    return bin(reached).count("1")


@contextmanager
def hooks_registered() -> Iterator[list[str]]:
    """Names the hooks put on activations while it is open. A fork node runs twice, and a hook
    on its output (`Tensor.register_hook`, `retain_grad`) would run twice with it: a forward
    that adds one turns the split off for its stage before its `I`."""
    seen: list[str] = []
    register, retain = torch.Tensor.register_hook, torch.Tensor.retain_grad

    def register_hook(self: Any, hook: Any) -> Any:
        if self.grad_fn is not None:
            seen.append("Tensor.register_hook")
        return register(self, hook)

    def retain_grad(self: Any) -> Any:
        if self.grad_fn is not None:
            seen.append("Tensor.retain_grad")
        return retain(self)

    setattr(torch.Tensor, "register_hook", register_hook)
    setattr(torch.Tensor, "retain_grad", retain_grad)
    try:
        yield seen
    finally:
        setattr(torch.Tensor, "register_hook", register)
        setattr(torch.Tensor, "retain_grad", retain)
