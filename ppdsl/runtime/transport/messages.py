"""What travels between ranks, besides the tensors themselves: the wire's message format.

- the description of a value sent to another rank (`describe`, `parse_description`,
  `Incoming`): its form and each member's shape, dtype and gradient flag;
- the header that carries it, once per cross-rank activation on the first step
  (`encode_header`, `decode_header`): a fixed int64 tensor, since the receiver must size its
  buffer before it knows anything;
- the label guard's `Label` on the first step's messages: the sending action and its place
  among the sends on its link.

`wire.py` says when each is sent; `comm.py` moves them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from attrs import frozen

from ...ir import Action, Kind
from ..framework import Framework
from ..interpreter.values import DICT, FORMS, SINGLE, Form, StageValueError, split
from .comm import PeerError

if TYPE_CHECKING:  # pragma: no cover
    Tensor = Any

# The dtypes a received buffer may have.
DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool")
MAX_DIMS = 8
# One header per message, before the first step's data of each cross-rank activation: a fixed
# int64 tensor (the receiver must size its buffer before knowing anything), word 0 the length of
# a JSON description in bytes, then the JSON, 8 bytes a word. JSON because the description
# grows (a layout, keys, per-member shape, dtype and gradient flag; other fields may follow).
HEADER_WORDS = 256
MAX_HEADER_BYTES = (HEADER_WORDS - 1) * 8
# The most elements the receiver allocates for one member from a header (8 GB of float32).
MAX_ELEMENTS = 1 << 31

# The guard's label on the first step: [kind of the send, its stage, its microbatch, how many
# sends on this link it is]. Its words lead the header a forward send already sends (one
# message), and a backward send sends a labelled empty header before its data (the same size,
# so a message of one kind fits where the other was expected and the label can say so). The
# label only prefixes the header: it needs nothing of what the header holds.
LABEL = 4


def describe(fw: Framework, value: Any, training: bool, where: str) -> dict[str, Any]:
    """The header of a value sent to another rank: layout and each member's shape, dtype and
    whether it needs a gradient back. Raises StageValueError for a member that is not a tensor."""
    layout, members = split(value)
    described = []
    for i, m in enumerate(members):
        if not fw.is_tensor(m):
            raise StageValueError(f"{where}: {layout.name(i)} is a {type(m).__name__}, not a {fw.tensor_type}; only "
                              "tensors can be sent to another rank (values of other types pass only "
                              "between two stages of the same rank)")
        described.append([fw.shape(m), fw.dtype_name(m), bool(training and fw.needs_grad(m))])
    return {"form": layout.form, "keys": list(layout.keys), "members": described}


@frozen
class Incoming:
    """What a receiver allocates from a header: the layout, and each member's buffer spec."""

    form: Form
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    grads: tuple[bool, ...]

    def buffers(self, fw: Framework) -> list[Any]:
        return [fw.empty(s, d) for s, d in zip(self.shapes, self.dtypes)]

    def join(self, fw: Framework, buffers: Sequence[Any]) -> Any:
        for b, g in zip(buffers, self.grads):
            fw.set_requires_grad(b, g)
        return self.form.join(buffers)


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
    return Incoming(Form(form, tuple(keys) if form == DICT else ()), tuple(shapes), tuple(types), tuple(grads))


def encode_header(fw: Framework, meta: dict[str, Any]) -> Tensor:
    import numpy as np

    data = json.dumps(meta, separators=(",", ":")).encode()
    if len(data) > MAX_HEADER_BYTES:
        raise ValueError(f"the description of a value to send takes {len(data)} bytes, more than the "
                         f"{MAX_HEADER_BYTES} a header holds: send fewer members")
    words = np.zeros(HEADER_WORDS, dtype="<i8")
    words[0] = len(data)
    words[1:] = np.frombuffer(data.ljust(MAX_HEADER_BYTES, b"\0"), dtype="<i8")
    return fw.from_numpy(words)

def empty_header(fw: Framework) -> Tensor:
    import numpy as np

    return fw.from_numpy(np.zeros(HEADER_WORDS, dtype="<i8"))

def decode_header(fw: Framework, header: Tensor) -> dict[str, Any]:
    import numpy as np

    words = np.ascontiguousarray(fw.to_numpy(header), dtype="<i8")
    n = int(words[0])
    if not 0 < n <= MAX_HEADER_BYTES:
        raise PeerError(f"garbled header (length {n}): the ranks disagree about what is sent")
    try:
        meta = json.loads(words[1:].tobytes()[:n].decode())
    except (UnicodeDecodeError, ValueError):
        raise PeerError("garbled header: the ranks disagree about what is sent") from None
    if not isinstance(meta, dict):
        raise PeerError(f"garbled header {meta!r}")
    return meta


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

    def tensor(self, fw: Framework, header: Tensor) -> Tensor:
        """The label followed by a header: what goes on the wire."""
        import numpy as np

        label = np.array([int(self.kind), self.stage, self.microbatch, self.ordinal], dtype="<i8")
        return fw.from_numpy(np.concatenate([label, fw.to_numpy(header).astype("<i8")]))

    @staticmethod
    def empty(fw: Framework) -> Tensor:
        """A buffer for a labelled header."""
        import numpy as np

        return fw.from_numpy(np.zeros(LABEL + HEADER_WORDS, dtype="<i8"))

    @classmethod
    def read(cls, fw: Framework, tensor: Tensor, stages: int, microbatches: int) -> Label:
        """The label in a received tensor; PeerError when it cannot be one (a message of
        another kind arrived where a label should: the ranks are out of step)."""
        kind, stage, mb, ordinal = (int(v) for v in fw.to_numpy(tensor).tolist()[:LABEL])
        if kind not in (int(Kind.SEND_F), int(Kind.SEND_B)) or not 0 <= stage < stages \
                or not 0 <= mb < microbatches or ordinal < 1:
            raise PeerError(f"garbled message label {[kind, stage, mb, ordinal]}: the ranks are out of step "
                            "(does every rank run with the label guard?)")
        return cls(Kind(kind), stage, mb, ordinal)
