"""What a stage takes and returns: a tensor, a tuple of values, or a dict of values.

As in Paddle's own pipelining, a stage's output becomes the next stage's input: a tuple is
spread as positional arguments (`layer(*value)`), a dict as keyword arguments
(`layer(**value)`), anything else is the one argument (`layer(value)`). A value is split into
its *members* (one for a single value) and put back together from them, so the interpreter
and the transport deal in flat lists.

Between two stages of one rank any member passes as it is; between ranks only tensor members
can travel (a string or an int has no buffer to send), and the sender refuses the others with
a message naming the member. A member needs a gradient back when it is a tensor with
`stop_gradient=False`; masks and integer ids are sent forward only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from attrs import frozen

# A value's shape of container; see the module docstring for how each one is called.
SINGLE, TUPLE, DICT = "single", "tuple", "dict"
FORMS = (SINGLE, TUPLE, DICT)


class StageValueError(ValueError):
    """A stage value that cannot be used as asked (a member that cannot cross ranks, ...)."""


@frozen
class Layout:
    """How a value's members are put back together: the form, and the keys of a dict."""

    form: str
    keys: tuple[str, ...] = ()

    def join(self, members: Sequence[Any]) -> Any:
        if self.form == SINGLE:
            return members[0]
        if self.form == TUPLE:
            return tuple(members)
        return dict(zip(self.keys, members))

    def name(self, index: int) -> str:
        """A member as a user would name it: `output[1]`, `output['mask']`, `output`."""
        if self.form == SINGLE:
            return "the value"
        if self.form == TUPLE:
            return f"member {index}"
        return f"member {self.keys[index]!r}"


def split(value: Any) -> tuple[Layout, list[Any]]:
    """A value -> its layout and its members, in order."""
    if type(value) in (tuple, list):
        return Layout(TUPLE), list(value)
    if isinstance(value, Mapping):
        keys = tuple(value)
        if not all(isinstance(k, str) for k in keys):
            raise StageValueError(f"a stage's dict value has keys {list(keys)!r}; only string keys name arguments")
        return Layout(DICT, keys), [value[k] for k in keys]
    return Layout(SINGLE), [value]


def call(layer: Callable[..., Any], value: Any, kwargs: Mapping[str, Any] | None = None) -> Any:
    """Run `layer` on a value: a tuple as positional arguments, a dict as keyword arguments."""
    extra = kwargs or {}
    if type(value) in (tuple, list):
        return layer(*value, **extra)
    if isinstance(value, Mapping):
        return layer(**value, **extra)
    return layer(value, **extra)


def is_tensor(obj: Any) -> bool:
    import paddle

    return isinstance(obj, paddle.Tensor)


def needs_grad(obj: Any) -> bool:
    return is_tensor(obj) and not obj.stop_gradient


def grad_members(value: Any) -> list[Any]:
    """The tensor members of a value that need a gradient, in member order."""
    return [m for m in split(value)[1] if needs_grad(m)]


def hand_over(value: Any, training: bool) -> Any:
    """A stage's output as the next stage's input on the same rank.

    Each tensor member becomes a new leaf, so each stage's backward stops at its own input;
    it needs a gradient exactly when the output member did (and only when training)."""
    layout, members = split(value)
    out = []
    for m in members:
        if is_tensor(m):
            leaf = m.detach()
            leaf.stop_gradient = not (training and not m.stop_gradient)
            out.append(leaf)
        else:
            out.append(m)
    return layout.join(out)


def split_batch(paddle: Any, value: Any, microbatches: int, what: str, need_tensor: bool = True) -> list[Any]:
    """A whole batch -> one value per microbatch: tensors split along dimension 0, other
    members the same in every microbatch (as Paddle's default chunking does)."""
    layout, members = split(value)
    if need_tensor and not any(isinstance(m, paddle.Tensor) for m in members):
        raise StageValueError(f"{what}: expected a paddle.Tensor (or a tuple or dict holding some), "
                          f"got {type(value).__name__}")
    columns: list[list[Any]] = []
    for i, m in enumerate(members):
        if not isinstance(m, paddle.Tensor):
            columns.append([m] * microbatches)
            continue
        n = m.shape[0] if m.shape else 0
        if n % microbatches:
            where = "" if layout.form == SINGLE else f" ({layout.name(i)})"
            raise StageValueError(f"{what}{where}: a batch of {n} cannot be split into {microbatches} equal microbatches")
        columns.append(list(paddle.split(m, microbatches, axis=0)) if microbatches > 1 else [m])
    return [layout.join([c[k] for c in columns]) for k in range(microbatches)]


def merge_batch(paddle: Any, chunks: Sequence[Any]) -> Any:
    """Microbatch outputs -> one batch (tensors concatenated along dimension 0)."""
    layout, first = split(chunks[0])
    columns = [split(c)[1] for c in chunks]
    merged = []
    for i, m in enumerate(first):
        parts = [col[i] for col in columns]
        merged.append(paddle.concat(parts, axis=0) if isinstance(m, paddle.Tensor) else parts)
    return layout.join(merged)


# --- what travels in the first step's header ----------------------------------------------

def describe(value: Any, training: bool, where: str) -> dict[str, Any]:
    """The header of a value sent to another rank: layout and each member's shape, dtype and
    whether it needs a gradient back. Raises StageValueError for a member that is not a tensor."""
    layout, members = split(value)
    described = []
    for i, m in enumerate(members):
        if not is_tensor(m):
            raise StageValueError(f"{where}: {layout.name(i)} is a {type(m).__name__}, not a paddle.Tensor; only "
                              "tensors can be sent to another rank (values of other types pass only "
                              "between two stages of the same rank)")
        described.append([list(m.shape), str(m.dtype).removeprefix("paddle."), bool(training and not m.stop_gradient)])
    return {"form": layout.form, "keys": list(layout.keys), "members": described}


@frozen
class Incoming:
    """What a receiver allocates from a header: the layout, and each member's buffer spec."""

    layout: Layout
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    grads: tuple[bool, ...]

    def buffers(self, paddle: Any) -> list[Any]:
        return [paddle.empty(list(s), dtype=d) for s, d in zip(self.shapes, self.dtypes)]

    def join(self, buffers: Sequence[Any]) -> Any:
        for b, g in zip(buffers, self.grads):
            b.stop_gradient = not g
        return self.layout.join(buffers)


def parse_description(meta: Any, dtypes: Sequence[str], max_dims: int, max_elements: int) -> Incoming:
    """A received header -> Incoming; anything malformed or oversized is a StageValueError."""
    if not isinstance(meta, dict):
        raise StageValueError(f"garbled header {meta!r}")
    form, keys, members = meta.get("form"), meta.get("keys", []), meta.get("members")
    if form not in FORMS or not isinstance(keys, list) or not isinstance(members, list) or not members:
        raise StageValueError(f"garbled header {meta!r}")
    if form == DICT and (len(keys) != len(members) or not all(isinstance(k, str) for k in keys)):
        raise StageValueError(f"garbled header {meta!r}: keys do not match members")
    if form == SINGLE and len(members) != 1:
        raise StageValueError(f"garbled header {meta!r}: a single value with {len(members)} members")
    shapes, types, grads = [], [], []
    for m in members:
        if not (isinstance(m, list) and len(m) == 3 and isinstance(m[0], list) and m[1] in dtypes
                and isinstance(m[2], bool)):
            raise StageValueError(f"garbled header member {m!r}")
        shape = m[0]
        if len(shape) > max_dims or not all(isinstance(d, int) and 0 <= d for d in shape):
            raise StageValueError(f"header member of shape {shape}: at most {max_dims} non-negative dimensions")
        n = 1
        for d in shape:
            n *= d
        if n > max_elements:
            raise StageValueError(f"header member of shape {shape} has {n} elements, more than the {max_elements} "
                              "the runtime allocates for one received tensor")
        shapes.append(tuple(shape))
        types.append(str(m[1]))
        grads.append(m[2])
    return Incoming(Layout(form, tuple(keys) if form == DICT else ()), tuple(shapes), tuple(types), tuple(grads))
