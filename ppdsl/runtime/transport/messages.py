"""What ranks tell each other besides the tensors themselves: the wire's message format.

- the description of a value sent to another rank (`describe`, `parse_description`,
  `Incoming`): its form and each member's shape, dtype and gradient flag;
- the label guard's `Label`: the sending action and its place among the sends on its link;
- the note that carries them (`encode_note`, `decode_note`): bytes posted to the job's
  key-value store on the first step, one per send action that has something to say, read
  by the matching receive before it posts its buffers. Notes never travel on the data links,
  so the links carry the same messages (the tensors) on every step.

`wire.py` says when each is posted; `comm.py` and `loopback.py` hold the store and the links.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from attrs import frozen

from ...ir import Action, Kind
from ..framework import Framework, Spread
from ..interpreter.values import DICT, FORMS, SINGLE, Form, StageValueError, split
from ..errors import PeerError

# The dtypes a received buffer may have.
DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool")
MAX_DIMS = 8
# A note is JSON: {"label": [kind, stage, microbatch, ordinal]} with the guard on, and
# {"value": description} for a forward send (or {"error": why} when it cannot be sent).
# JSON because the description grows (a form, keys, per-member shape, dtype and gradient flag).
MAX_NOTE_BYTES = 1 << 20
# The most elements the receiver allocates for one member from a description (8 GB of float32).
MAX_ELEMENTS = 1 << 31
REDUCE_OPS = ("sum", "avg", "max", "min", "product")  # a Partial placement's, as DTensor names them


def describe(fw: Framework, value: Any, training: bool, where: str) -> dict[str, Any]:
    """The description of a value sent to another rank: form and each member's shape, dtype and
    whether it needs a gradient back. Raises StageValueError for a member that is not a tensor."""
    layout, members = split(value)
    described = []
    for i, m in enumerate(members):
        if not fw.is_tensor(m):
            raise StageValueError(f"{where}: {layout.name(i)} is a {type(m).__name__}, not a {fw.tensor_type}; only "
                              "tensors can be sent to another rank (values of other types pass only "
                              "between two stages of the same rank)")
        spread = fw.spread(m)
        # What travels is this rank's part (a DTensor's local tensor); its layout rides along.
        entry: list[Any] = [fw.shape(fw.local(m)), fw.dtype_name(m), bool(training and fw.needs_grad(m))]
        described.append(entry if spread is None else [*entry, spread])
    return {"form": layout.form, "keys": list(layout.keys), "members": described}


def parse_spread(spread: Any, max_dims: int, max_elements: int) -> Spread:
    """A described layout (`Framework.spread`) checked; StageValueError for a malformed one."""
    if not isinstance(spread, dict):
        raise StageValueError(f"garbled layout {spread!r}")
    placements, shape, stride = spread.get("placements"), spread.get("shape"), spread.get("stride")
    if not isinstance(placements, list) or not 0 < len(placements) <= max_dims or not all(map(_placement, placements)):
        raise StageValueError(f"garbled layout {spread!r}: placements")
    if not (isinstance(shape, list) and isinstance(stride, list) and len(shape) == len(stride) <= max_dims
            and all(map(_size, shape + stride)) and _elements(shape) <= max_elements):
        raise StageValueError(f"garbled layout {spread!r}: shape and stride")
    return {"placements": placements, "shape": shape, "stride": stride}


def _size(d: Any) -> bool:
    return isinstance(d, int) and not isinstance(d, bool) and d >= 0


def _placement(p: Any) -> bool:
    """["S", dim], ["R"] or ["P", reduce op] (`Framework.spread`)."""
    return p == ["R"] or (isinstance(p, list) and len(p) == 2 and (
        (p[0] == "S" and isinstance(p[1], int) and not isinstance(p[1], bool)) or (p[0] == "P" and p[1] in REDUCE_OPS)))


def _elements(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@frozen
class Incoming:
    """What a receiver allocates from a description: the form, and each member's buffer spec."""

    form: Form
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    grads: tuple[bool, ...]
    spreads: tuple[Spread | None, ...] = ()  # per member, its layout over a mesh (none: plain)

    def buffers(self, fw: Framework) -> list[Any]:
        return [fw.empty(s, d) for s, d in zip(self.shapes, self.dtypes)]

    def join(self, fw: Framework, buffers: Sequence[Any], mesh: Callable[[], Any]) -> Any:
        """The value, from the received buffers: a member sent as a part of a tensor laid out
        over a mesh is rebuilt over `mesh()` (the receiving stage's), a leaf of its own."""
        members = list(buffers)
        for i, spread in enumerate(self.spreads):
            if spread is not None:
                members[i] = fw.rewrap(members[i], mesh(), spread)
        for b, g in zip(members, self.grads):
            fw.set_requires_grad(b, g)
        return self.form.join(members)


def parse_description(meta: Any, dtypes: Sequence[str], max_dims: int, max_elements: int) -> Incoming:
    """A received description -> Incoming; anything malformed or oversized is a StageValueError."""
    if not isinstance(meta, dict):
        raise StageValueError(f"garbled description {meta!r}")
    form, keys, members = meta.get("form"), meta.get("keys", []), meta.get("members")
    if form not in FORMS or not isinstance(keys, list) or not isinstance(members, list) or not members:
        raise StageValueError(f"garbled description {meta!r}")
    if form == DICT and (len(keys) != len(members) or not all(isinstance(k, str) for k in keys)):
        raise StageValueError(f"garbled description {meta!r}: keys do not match members")
    if form == SINGLE and len(members) != 1:
        raise StageValueError(f"garbled description {meta!r}: a single value with {len(members)} members")
    shapes, types, grads, spread = [], [], [], []
    for m in members:
        if not (isinstance(m, list) and len(m) in (3, 4) and isinstance(m[0], list) and m[1] in dtypes
                and isinstance(m[2], bool)):
            raise StageValueError(f"garbled description member {m!r}")
        shape = m[0]
        if len(shape) > max_dims or not all(isinstance(d, int) and 0 <= d for d in shape):
            raise StageValueError(f"described member of shape {shape}: at most {max_dims} non-negative dimensions")
        spread.append(parse_spread(m[3], max_dims, max_elements) if len(m) == 4 else None)
        n = _elements(shape)
        if n > max_elements:
            raise StageValueError(f"described member of shape {shape} has {n} elements, more than the {max_elements} "
                              "the runtime allocates for one received tensor")
        shapes.append(tuple(shape))
        types.append(str(m[1]))
        grads.append(m[2])
    return Incoming(Form(form, tuple(keys) if form == DICT else ()), tuple(shapes), tuple(types), tuple(grads),
                    tuple(spread) if any(x is not None for x in spread) else ())


def encode_note(label: Label | None, value: dict[str, Any] | None = None, error: str | None = None,
                abandoned: bool = False, grads: Sequence[Spread | None] = ()) -> bytes:
    """A send's note: its label (guard on), the description of what it sends (a forward), or
    why it cannot be sent; `abandoned`: the sender stopped on its first step, `error` says why;
    `grads`: a backward send's gradients' layouts, where one is laid out over a mesh."""
    note: dict[str, Any] = {"abandoned": True} if abandoned else {}
    if label is not None:
        note["label"] = label.words()
    if value is not None:
        note["value"] = value
    if any(g is not None for g in grads):
        note["grads"] = list(grads)
    if error is not None:
        note["error"] = error
    data = json.dumps(note, separators=(",", ":")).encode()
    if len(data) > MAX_NOTE_BYTES:
        raise StageValueError(f"the description of a value to send takes {len(data)} bytes, more than the "
                              f"{MAX_NOTE_BYTES} a note holds: send fewer members")
    return data


def decode_note(data: bytes) -> dict[str, Any]:
    """A received note; PeerError when it is not one (the ranks disagree about what is sent)."""
    if len(data) > MAX_NOTE_BYTES:
        raise PeerError(f"garbled note ({len(data)} bytes): the ranks disagree about what is sent")
    try:
        note = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError):
        raise PeerError("garbled note: the ranks disagree about what is sent") from None
    if not isinstance(note, dict):
        raise PeerError(f"garbled note {note!r}")
    return note


@frozen
class Label:
    """What a message is: the sending action and its place among the sends on its link."""

    kind: Kind
    stage: int
    microbatch: int
    ordinal: int  # 1 for the first message sent on this link in the step

    @property
    def action(self) -> str:
        return str(Action(self.stage, self.kind, self.microbatch))

    def words(self) -> list[int]:
        return [int(self.kind), self.stage, self.microbatch, self.ordinal]

    @classmethod
    def read(cls, words: Any, stages: int, microbatches: int) -> Label:
        """The label a note holds; PeerError when it cannot be one (the ranks are out of step)."""
        if not (isinstance(words, list) and len(words) == 4 and all(type(w) is int for w in words)):
            raise PeerError(f"garbled message label {words!r}: the ranks are out of step "
                            "(does every rank run with the label guard?)")
        kind, stage, mb, ordinal = words
        if kind not in (int(Kind.SEND_F), int(Kind.SEND_B)) or not 0 <= stage < stages \
                or not 0 <= mb < microbatches or ordinal < 1:
            raise PeerError(f"garbled message label {words}: the ranks are out of step "
                            "(does every rank run with the label guard?)")
        return cls(Kind(kind), stage, mb, ordinal)
