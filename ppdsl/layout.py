"""The integer layout of a program's actions and of what completes, stated once.

- a *code* is one action: `code = sm << KIND_BITS | kind`, with `sm = stage * microbatches + mb`
  ("sm": the stage-and-microbatch number) and `kind` a `Kind` value. `code` and `sm_code` make
  one; `kind_of` and `sm_of` read one back. `codes_of_kind`, `kind_slice`, `code_space` and
  `MB_STRIDE` are the bulk forms derived from `code`;
- a *stage-kind* ("sk", `stage_kind`) is how a reader keeps a step before it knows the
  microbatch count: `stage << KIND_BITS | kind`;
- a *key* is one thing that completes: `key = sm << SLOT_BITS | slot` (`key_of`, `key_sm`,
  `key_slot`), the slots F_DONE..MSG_B_SENT below (`kinds.SLOTS`);
- a *place* is `rank << SHIFT | i`, i the index of an action in its rank's codes.

Code outside the hot loops uses these names; a hot loop binds the constants to locals once.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat
from operator import add, mul

from .kinds import (COMM_MAX as COMM_MAX, COMPUTE_MAX as COMPUTE_MAX, EXCHANGE_BIT as EXCHANGE_BIT,
                    KIND_BITS as KIND_BITS, KIND_MASK as KIND_MASK, RECEIVE_BIT as RECEIVE_BIT, SLOT_BITS as SLOT_BITS,
                    SLOT_MASK as SLOT_MASK, TABLE, Kind)

# KIND_BITS, SLOT_BITS: a code's low bits (the Kind value) and a key's (its slot), as wide as the
# table of kinds (`ppdsl/kinds.py`) needs; a kind or slot more widens them.
INVALID_CODE = -1  # an action out of range: no code (its kind bits read KIND_MASK, no real kind)
# A place in the program: `rank << SHIFT | i`, i the index of the action in its rank's codes
# (the checker's position table, lowering).
SHIFT = 32
LOW = (1 << SHIFT) - 1

# Kind numbers as plain ints (IntEnum arithmetic is slower on the hot paths).
F, I, W, B = int(Kind.F), int(Kind.I), int(Kind.W), int(Kind.B)
SEND_F, RECV_F, SEND_B, RECV_B = int(Kind.SEND_F), int(Kind.RECV_F), int(Kind.SEND_B), int(Kind.RECV_B)
KIND_SPACE = KIND_MASK + 1  # how many kind values the low bits hold: the length of a table per kind
KIND_OF: tuple[Kind, ...] = tuple(Kind(k) if k in TABLE.by_value else Kind.F for k in range(KIND_SPACE))

# Slots of a dependency key: key = sm << SLOT_BITS | slot, where sm = stage * microbatches + mb
# (`kinds.SLOTS`).
_SLOT = TABLE.slot_value
F_DONE, GRAD_DONE, I_DONE = _SLOT["F_DONE"], _SLOT["GRAD_DONE"], _SLOT["I_DONE"]
RECV_F_DONE, RECV_B_DONE, MSG_F_SENT, MSG_B_SENT = (_SLOT["RECV_F_DONE"], _SLOT["RECV_B_DONE"], _SLOT["MSG_F_SENT"],
                                                    _SLOT["MSG_B_SENT"])
SLOT_SPACE = SLOT_MASK + 1  # how many slot values a key's low bits hold: the stride of one sm's keys
# Engines size their table of keys past the end by one stage: the input of a send or receive
# to a stage outside the pipeline lands there (a negative key wraps around to it) and never
# completes; NO_KEY, its last key, is what a receive with nothing left on its link waits for.
NO_KEY = -1
# The kinds that move data between ranks (`Kind.is_comm`), as a tuple and as a set.
COMM_KINDS: tuple[int, ...] = TABLE.comm
_COMM_KINDS = frozenset(COMM_KINDS)
SLOT_NAMES: dict[int, str] = TABLE.slot_names

# A slot no action completes, done from the start in every engine: a table entry meaning "waits
# for nothing" points at it, so the hot loops test no None (times start at 0, so waiting for it
# delays nothing). The top slot value, past every real slot.
NOTHING = TABLE.nothing
# The kinds that compute, Kind values 0..COMPUTE_MAX (the hot loops test `k <= COMPUTE_MAX`);
# then the sends and receives up to COMM_MAX, then the stage-only kinds.
COMPUTE_KINDS: tuple[int, ...] = TABLE.compute
# EXCHANGE_BIT: of the kinds up to COMM_MAX, the sends and receives are those with this bit set
# (0 when no bit tells them so): in a row with no stage-only action, `code & EXCHANGE_BIT` tells
# them apart in one C-level pass.
# RECEIVE_BIT: of the sends and receives, `k & RECEIVE_BIT` is a receive.


def kind_of(code: int) -> int:
    """The kind (a `Kind` value) of a code."""
    return code & KIND_MASK


def sm_of(code: int) -> int:
    """The stage-and-microbatch number `sm` of a code."""
    return code >> KIND_BITS


def key_of(sm: int, slot: int) -> int:
    """The key of slot `slot` of the stage-and-microbatch `sm`."""
    return sm << SLOT_BITS | slot


def key_sm(k: int) -> int:
    """The `sm` of a key."""
    return k >> SLOT_BITS


def key_slot(k: int) -> int:
    """The slot of a key."""
    return k & SLOT_MASK


def code_key(code: int, slot: int) -> int:
    """The key of slot `slot` of the code's own stage and microbatch."""
    return (code >> KIND_BITS) << SLOT_BITS | slot


def code(stage: int, microbatch: int, kind: int, microbatches: int) -> int:
    """The code of one action: the layout, stated here once (`sm_code` of its `sm = stage *
    microbatches + microbatch`). Every other place that makes codes derives them from these
    two: by the stride below for runs of microbatches (`codes_of_kind`, `kind_slice`), by
    per-value tables for a reader's rows (`codes_from_reader`), by a call elsewhere. One
    place spells the formula inline, the encoder's loop over a row of Action objects, where
    a call per action costs 2.3x the loop (0.128 s against 0.055 s for 262,144 actions).
    Decoding: `code >> KIND_BITS` is the `sm`, `code & KIND_MASK` the kind."""
    return ((stage * microbatches + microbatch) << KIND_BITS) | kind


def sm_code(sm: int, kind: int) -> int:
    """The code of kind `kind` of the (stage, microbatch) numbered `sm` (see `code`)."""
    return sm << KIND_BITS | kind


def code_space(stages: int, microbatches: int) -> int:
    """How many codes a program of that shape has: tables over codes have this length."""
    return code(stages, 0, 0, microbatches)


def kind_slice(stage: int, kind: int, microbatches: int) -> slice:
    """Where the codes of one stage and kind, every microbatch in order, sit in a table over
    the code space (`pos[kind_slice(...)]`, or assigned to at once)."""
    return slice(code(stage, 0, kind, microbatches), code(stage + 1, 0, kind, microbatches), MB_STRIDE)


# From the code of one microbatch to the next's, of the same stage and kind.
MB_STRIDE = code(0, 1, 0, 1)


def codes_of_kind(stage: int, kind: int, microbatches: int, which: Sequence[int] | None = None) -> Sequence[int]:
    """The codes of one stage and kind for the microbatches `which` (all, in order, when
    None), in bulk: those of every microbatch are one range."""
    first = code(stage, 0, kind, microbatches)
    if which is None or which == range(microbatches):
        return range(first, first + microbatches * MB_STRIDE, MB_STRIDE)
    return list(map(add, repeat(first), map(mul, which, repeat(MB_STRIDE))))


def stage_kind(stage: int, kind: int) -> int:
    """How a reader keeps the stage and kind of one step (`ir.RowCodes`)."""
    return stage << KIND_BITS | kind

