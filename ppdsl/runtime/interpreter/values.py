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
from typing import TYPE_CHECKING, Any

from attrs import frozen

if TYPE_CHECKING:  # pragma: no cover
    from ..framework import Framework

# A value's shape of container; see the module docstring for how each one is called.
SINGLE, TUPLE, DICT = "single", "tuple", "dict"
FORMS = (SINGLE, TUPLE, DICT)


class StageValueError(ValueError):
    """A stage value that cannot be used as asked (a member that cannot cross ranks, ...)."""


@frozen
class Form:
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


def split(value: Any) -> tuple[Form, list[Any]]:
    """A value -> its layout and its members, in order."""
    if type(value) in (tuple, list):
        return Form(TUPLE), list(value)
    if isinstance(value, Mapping):
        keys = tuple(value)
        if not all(isinstance(k, str) for k in keys):
            raise StageValueError(f"a stage's dict value has keys {list(keys)!r}; only string keys name arguments")
        return Form(DICT, keys), [value[k] for k in keys]
    return Form(SINGLE), [value]


def call(layer: Callable[..., Any], value: Any, kwargs: Mapping[str, Any] | None = None) -> Any:
    """Run `layer` on a value: a tuple as positional arguments, a dict as keyword arguments."""
    extra = kwargs or {}
    if type(value) in (tuple, list):
        return layer(*value, **extra)
    if isinstance(value, Mapping):
        return layer(**value, **extra)
    return layer(value, **extra)


def grad_members(fw: Framework, value: Any) -> list[Any]:
    """The tensor members of a value that need a gradient, in member order."""
    return [m for m in split(value)[1] if fw.needs_grad(m)]


def hand_over(fw: Framework, value: Any, training: bool) -> Any:
    """A stage's output as the next stage's input on the same rank.

    Each tensor member becomes a new leaf, so each stage's backward stops at its own input;
    it needs a gradient exactly when the output member did (and only when training)."""
    layout, members = split(value)
    out = []
    for m in members:
        if fw.is_tensor(m):
            out.append(fw.leaf(m, training and fw.needs_grad(m)))
        else:
            out.append(m)
    return layout.join(out)


def to_device(fw: Framework, value: Any) -> Any:
    """A value with its tensor members on the framework's bound device (itself on the CPU)."""
    if not fw.device.is_gpu:
        return value
    layout, members = split(value)
    return layout.join([fw.to_device(m) if fw.is_tensor(m) else m for m in members])


def split_batch(fw: Framework, value: Any, microbatches: int, what: str, need_tensor: bool = True) -> list[Any]:
    """A whole batch -> one value per microbatch: tensors split along dimension 0, other
    members the same in every microbatch (as Paddle's default chunking does)."""
    layout, members = split(value)
    if need_tensor and not any(fw.is_tensor(m) for m in members):
        raise StageValueError(f"{what}: expected a {fw.tensor_type} (or a tuple or dict holding some), "
                          f"got {type(value).__name__}")
    columns: list[list[Any]] = []
    for i, m in enumerate(members):
        if not fw.is_tensor(m):
            columns.append([m] * microbatches)
            continue
        n = int(m.shape[0]) if len(m.shape) else 0
        if n % microbatches:
            where = "" if layout.form == SINGLE else f" ({layout.name(i)})"
            raise StageValueError(f"{what}{where}: a batch of {n} cannot be split into {microbatches} equal microbatches")
        columns.append(fw.chunk(m, microbatches))
    return [layout.join([c[k] for c in columns]) for k in range(microbatches)]


def merge_batch(fw: Framework, chunks: Sequence[Any]) -> Any:
    """Microbatch outputs -> one batch (tensors concatenated along dimension 0)."""
    layout, first = split(chunks[0])
    columns = [split(c)[1] for c in chunks]
    merged = []
    for i, m in enumerate(first):
        parts = [col[i] for col in columns]
        merged.append(fw.concat(parts) if fw.is_tensor(m) else parts)
    return layout.join(merged)
