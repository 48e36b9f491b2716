"""The activation memory model, the one the checker (PPS301), the simulator and the search share.

The unit is one microbatch's activations of a rank's whole share of the model (`UNIT`): a
forward `F(s,m)` makes its stage's share live, 1/v when the rank of s holds v stages
(`rank_weights`: a V chunk counts 1/2, so 1F1B and ZB-V both peak at p, as the zero-bubble
papers count), or the stage's weight when weights are given. The backward that consumes it
frees it: `B(s,m)`, or `W(s,m)` when the backward is split, since the weight gradient still
needs the saved inputs. A forward whose (stage, microbatch) has a recompute `R` keeps only its
input, which the unit does not count, and the `R` makes its activations live again; an
`OFFLOAD` frees them from the device (to host memory) and its `RELOAD` makes them live again.
In an overlapped pair the
forward allocates before the backward frees, so both count at that step. Peaks are measured
per rank in step order, which is the order a rank allocates in whatever the timing.

The rule is written once, in `signs` (which kind makes live and which frees), read by
`_deltas` (what each action of a rank adds or frees, from the program's integer encoding) and
by the search (`search.slots`); `profile` sums it step by step (and gives the live count after
each step), `peaks_from_codes` only the peaks, by prefix sums over the codes.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from itertools import accumulate, compress, repeat
from operator import and_, eq, rshift

from attrs import field, frozen

from .cuts import carried
from .encoding import B, Encoded, F, I, W, encode
from .gather import gather
from .kinds import TABLE
from .layout import KIND_BITS, KIND_MASK
from .ir import Kind, Program


R, OFFLOAD, RELOAD = int(Kind.R), int(Kind.OFFLOAD), int(Kind.RELOAD)
UNSHARD, RESHARD = int(Kind.UNSHARD), int(Kind.RESHARD)
RECV_F, SEND_B, RECV_B = int(Kind.RECV_F), int(Kind.SEND_B), int(Kind.RECV_B)

UNIT = "microbatches of a rank's activations"  # what every printed peak and limit counts
# A limit in bytes (`--max-memory 6GiB`): decimal and binary multiples, as disks and
# allocators write them.
BYTE_UNITS: dict[str, int] = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
                              "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "PiB": 2**50}
_UNIT_OF = {name.lower(): name for name in BYTE_UNITS}
_AMOUNT = re.compile(r"^\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)\s*$")
# No machine holds more (an exabyte): past it a limit is a typo, and its sums stop being exact.
MAX_BYTES = 10**18
# A limit is compared after adding weights such as 1/3 a few thousand times: absorb the rounding.
EPSILON = 1e-9


def rank_weights(placement: Sequence[int], ranks: int | None = None) -> list[float]:
    """Per stage, its share of its rank's layers (1/v when the rank holds v stages)."""
    held = [0] * (max(placement, default=-1) + 1 if ranks is None else ranks)
    for r in placement:
        held[r] += 1
    return [1.0 / held[r] for r in placement]


def over(peak: float, limit: float) -> bool:
    """Whether `peak` exceeds `limit` by more than the rounding of summed fractions."""
    return peak > limit + EPSILON


@frozen
class MemoryProfile:
    peak: tuple[float, ...]  # per rank
    peak_step: tuple[int | None, ...]  # per rank: the first step index at which the peak is reached
    live_after: tuple[tuple[float, ...], ...]  # per rank, per step: live activations after it


def signs(split: bool) -> list[int]:
    """Per kind (Kind value; a list of `layout.KIND_SPACE`): +1 for the action that makes its
    (stage, microbatch)'s activations live, -1 for the one that frees them, 0 otherwise.
    `split`: the backward is split, so its `W` frees (the weight gradient still needs the
    saved inputs), not its `I`. The one statement of the model, each kind's `memory` in the
    table of kinds (`ppdsl/kinds.py`): `_deltas` and the search's memory read it."""
    return TABLE.signs(split)


def _split(enc: Encoded) -> set[int]:
    """The `stage * M + mb` whose backward is split (the program has their `I`)."""
    return _having(enc, I)


def _having(enc: Encoded, kind: int) -> set[int]:
    """The `stage * M + mb` the program has an action of `kind` of."""
    out: set[int] = set()
    if kind in enc.kinds:
        for codes in enc.codes:
            out.update(map(rshift, compress(codes, map(eq, map(and_, codes, repeat(KIND_MASK)), repeat(kind))),
                           repeat(KIND_BITS)))
    return out


def _deltas(enc: Encoded, weights: Sequence[float] | None, trusted: bool, kept: Sequence[float] | None = None,
            inputs: Sequence[float] | None = None, outputs: Sequence[float] | None = None,
            gathered: Sequence[float] | None = None) -> Sequence[Sequence[float]]:
    """Per rank, per action (code): the activations it makes live (+) or frees (-).

    `F` adds its stage's weight; `B` frees it unless that backward is split, `W` when it is.
    One sign per kind says it when no backward is both full and split and every `W` has its
    `I` (always after the checker's completeness: `trusted`), and the deltas come from
    C-level passes; otherwise each `B` and `W` is looked up.

    `kept` (bytes, with `weights` in bytes): per stage, what a split backward's `I` leaves
    live until its `W` (the saved inputs and output gradients of the weight gradient, not
    the whole graph): that `I` frees the rest of the forward's bytes and `W` frees `kept`.
    `inputs` (bytes): per stage, what a forward with a later `R` keeps (its input); `outputs`
    (bytes): per stage, its output (and gradient), while a message or a hand-over holds it;
    `gathered` (bytes): per stage, its whole weights, from its `UNSHARD` to its `RESHARD`."""
    M = enc.microbatches
    if kept is not None:
        assert weights is not None, "bytes kept after I need the forward's bytes"
        return _byte_deltas(enc, weights, kept, inputs, outputs, gathered)
    if R in enc.kinds:  # a forward's weight depends on whether its (stage, microbatch) has an `R`
        per_stage = [1.0] * enc.stages if weights is None else [float(w) for w in weights]
        return _byte_deltas(enc, per_stage, per_stage)
    # A program with both kinds of backward: a `B` frees and so does a `W` (of a split one).
    sign = signs(split=False)
    split: set[int] = set()
    if I in enc.kinds:
        sign[W] = signs(split=True)[W]
        if not trusted:
            split = _split(enc)
            full: set[int] = set()
            frees_on_w: set[int] = set()
            for codes in enc.codes:
                kinds = list(map(and_, codes, repeat(KIND_MASK)))
                full.update(map(rshift, compress(codes, map(eq, kinds, repeat(B))), repeat(KIND_BITS)))
                frees_on_w.update(map(rshift, compress(codes, map(eq, kinds, repeat(W))), repeat(KIND_BITS)))
            if frees_on_w <= split and full.isdisjoint(split):
                split = set()  # one sign per kind says it after all
            else:
                sign = []
    # Without any `I`, no backward is split: a `W` frees nothing (sign 0).
    per_sm = [1.0] * (enc.stages * M) if weights is None else [float(w) for w in weights for _ in range(M)]
    if sign:
        if weights is None:
            return [gather(sign, map(and_, codes, repeat(KIND_MASK))) for codes in enc.codes]
        kb, km = KIND_BITS, KIND_MASK  # per action: locals, not a call
        return [[per_sm[c >> kb] * sign[c & km] for c in codes] for codes in enc.codes]
    # Each `B` and `W` looked up: a split backward's `I` keeps all of its forward's weight for its `W`.
    per_stage = [1.0] * enc.stages if weights is None else [float(w) for w in weights]
    return _byte_deltas(enc, per_stage, per_stage)


def _byte_deltas(enc: Encoded, weights: Sequence[float], kept: Sequence[float],
                 inputs: Sequence[float] | None = None, outputs: Sequence[float] | None = None,
                 gathered: Sequence[float] | None = None) -> list[list[float]]:
    """`_deltas` by one lookup per action: `F` adds its stage's weight (only its `inputs`,
    nothing in the unit, when an `R` of its (stage, microbatch) makes it again: the forward
    keeps only its input, and the `R` adds the rest), a `B` not split frees it, an `I` frees
    all but `kept` and its `W` frees `kept`; `OFFLOAD` frees all but its `inputs` (to host
    memory) and `RELOAD` brings that back.

    With `outputs`, the messages too (a lowered program's, as `ppdsl run` runs it): a
    `RECV_F` holds the stage before's output until the `F` takes it into its activations, a
    `RECV_B` holds the gradient of the stage's output until the backward (`B` or `I`) takes
    it, and a backward makes the gradient of its input, held until its `SEND_B`, or until the
    backward of the stage before when that stage is on the same rank."""
    M = enc.microbatches
    split = _split(enc)
    remade = _having(enc, R)
    held = [0.0] * enc.stages if inputs is None else [float(x) for x in inputs]
    out_bytes = [0.0] * enc.stages if outputs is None else [float(x) for x in outputs]
    # Per stage s: its input's gradient is sent (to another rank's stage s - 1) or handed over.
    sent = [s > 0 and enc.placement[s - 1] != enc.placement[s] for s in range(enc.stages)]
    comms = enc.has_comms
    out: list[list[float]] = []
    km, kb = KIND_MASK, KIND_BITS
    for codes in enc.codes:
        row: list[float] = []
        for c in codes:
            k, sm = c & km, c >> kb
            s = sm // M
            if k == F:
                d = held[s] if sm in remade else weights[s]
            elif k == R or k == RELOAD:
                d = weights[s] - held[s]
            elif k == OFFLOAD:
                d = held[s] - weights[s]
            elif k == B and sm not in split:
                d = -weights[s]
            elif k == I:
                d = kept[s] - weights[s]
            elif k == W and sm in split:
                d = -kept[s]
            elif gathered is not None and k == UNSHARD:  # a stage-only code: microbatch 0, `s` its stage
                d = gathered[s]
            elif gathered is not None and k == RESHARD:
                d = -gathered[s]
            else:
                d = 0.0
            if outputs is not None and k in _MESSAGE_KINDS:
                d += _message_delta(k, s, out_bytes, sent, comms, enc.stages)
            row.append(d)
        out.append(row)
    return out


_MESSAGE_KINDS = frozenset((F, B, I, RECV_F, SEND_B, RECV_B))


def _message_delta(k: int, s: int, out_bytes: Sequence[float], sent: Sequence[bool], comms: bool,
                   stages: int) -> float:
    """What an action of kind k of stage s adds to the bytes messages hold (`_byte_deltas`
    with `outputs`). `sent[s]`: stage s - 1 is on another rank. A compute-only program's
    messages are instant: only the hand-overs between stages of one rank hold anything."""
    if k == RECV_F:
        return out_bytes[s - 1]
    if k == RECV_B:
        return out_bytes[s]
    if k == SEND_B:
        return -out_bytes[s - 1]
    if k == F:  # the received input joins the forward's activations
        return -out_bytes[s - 1] if s > 0 and sent[s] and comms else 0.0
    # A backward (`B` or `I`) takes its output's gradient and makes its input's.
    d = 0.0
    if s + 1 < stages and (comms or not sent[s + 1]):
        d -= out_bytes[s]
    if s > 0 and (comms or not sent[s]):
        d += out_bytes[s - 1]
    return d


def _unit(placement: Sequence[int], weights: Sequence[float] | None) -> tuple[Sequence[float] | None, float]:
    """(weights for `_deltas`, factor for what it sums). In `UNIT` on ranks that all hold v
    stages, count stage activations (integers, the fast path) and divide the sums by v;
    on uneven ranks, weigh each stage by `rank_weights`."""
    if weights is not None:
        return weights, 1.0
    held = set(Counter(placement).values())
    if len(held) == 1:
        return None, 1.0 / held.pop()
    return rank_weights(placement), 1.0


def _check_weights(program: Program, weights: Sequence[float] | None) -> None:
    if weights is not None and len(weights) != program.stages:
        raise ValueError(f"memory weights give {len(weights)} stages, the program has {program.stages}")


def profile(program: Program, weights: Sequence[float] | None = None, kept: Sequence[float] | None = None,
            inputs: Sequence[float] | None = None, outputs: Sequence[float] | None = None,
            gathered: Sequence[float] | None = None) -> MemoryProfile:
    _check_weights(program, weights)
    enc = encode(program)
    if enc.invalid:
        raise ValueError("the program has out-of-range actions; check() reports them")
    peaks: list[float] = []
    peak_steps: list[int | None] = []
    lives: list[tuple[float, ...]] = []
    weights, scale = _unit(program.placement, weights)
    for rank, deltas in enumerate(_deltas(enc, weights, trusted=False, kept=kept, inputs=inputs, outputs=outputs,
                                          gathered=gathered)):
        n = len(program.rows[rank])
        # Per step: what it allocates and what it frees (an overlapped pair does both).
        alloc = [0.0] * n
        freed = [0.0] * n
        steps = enc.steps[rank]
        for i, d in enumerate(deltas):
            step = i if steps is None else steps[i]
            if d > 0:
                alloc[step] += d
            elif d < 0:
                freed[step] -= d
        live = 0.0
        peak = 0.0
        peak_step: int | None = None
        after: list[float] = []
        for step in range(n):
            live += alloc[step]
            if live > peak:
                peak, peak_step = live, step
            live -= freed[step]
            after.append(live)
        peaks.append(peak * scale)
        peak_steps.append(peak_step)
        lives.append(tuple(x * scale for x in after) if scale != 1.0 else tuple(after))
    return MemoryProfile(tuple(peaks), tuple(peak_steps), tuple(lives))


def peak_memory(program: Program, weights: Sequence[float] | None = None) -> tuple[float, ...]:
    """Peak live activations per rank, in `UNIT` (or in the weights' unit when given)."""
    return profile(program, weights).peak


def peak_stage_activations(program: Program) -> tuple[int, ...]:
    """Peak live (stage, microbatch) activations per rank, each 1 whatever its share: what
    `ppdsl run --profile` counts (one graph per stage and microbatch), v times `UNIT` on a
    rank of v stages."""
    return tuple(int(p) for p in profile(program, [1.0] * program.stages).peak)


def peaks_from_codes(enc: Encoded, weights: Sequence[float] | None, trusted: bool = False,
                     kept: Sequence[float] | None = None, inputs: Sequence[float] | None = None,
                     outputs: Sequence[float] | None = None,
                     gathered: Sequence[float] | None = None) -> list[tuple[float, int | None]] | None:
    """Per rank (peak, first step at the peak): `profile`'s peaks as prefix sums over the
    codes, at a fraction of its cost (a test holds them equal). None (use `profile`) for rows
    with overlapped pairs, where a step both allocates and frees. `trusted`: the checker,
    after completeness (see `_deltas`)."""
    if any(not is_batch for groups in enc.groups for is_batch, _ in groups.values()):
        return None
    out: list[tuple[float, int | None]] = []
    weights, scale = _unit(enc.placement, weights)
    for rank, deltas in enumerate(_deltas(enc, weights, trusted, kept, inputs, outputs, gathered)):
        live = list(accumulate(deltas))
        peak = max(live, default=0)
        if peak <= 0:
            out.append((0.0, None))
            continue
        out.append((float(peak) * scale, enc.step_of(rank, live.index(peak))))
    return out


# --- memory in bytes ------------------------------------------------------------------------

def _sizes(values: Sequence[float]) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


@frozen
class Sizes:
    """Bytes per stage, as `ppdsl run --profile` measures them (one microbatch's worth):

    - `activation[s]`: what a forward of stage s keeps alive until its backward frees it;
    - `kept[s]`: what a split backward's `I` keeps alive until its `W`;
    - `state[s]`: the stage's weights, gradients and optimizer state, alive all step;
    - `input[s]`: what a forward of stage s keeps beside the tensors autograd saved (its input
      and output, part of `activation`): all it keeps until its `R` when an `R` runs it again,
      and what stays on the device while an `OFFLOAD` has the rest in host memory (empty:
      nothing, as the unit counts it);
    - `output[s]`: a stage's output, and so its gradient: what a message holds on the rank
      that receives it until the action that takes it, and an input gradient on the rank that
      made it until it is sent or taken (empty: nothing);
    - `gathered[s]`: a sharded stage's whole weights, live from its `UNSHARD` to its
      `RESHARD` beside the shard its `state` counts (empty: nothing).
    """

    activation: tuple[float, ...] = field(converter=_sizes)
    kept: tuple[float, ...] = field(converter=_sizes)
    state: tuple[float, ...] = field(converter=_sizes)
    input: tuple[float, ...] = field(default=(), converter=_sizes)
    output: tuple[float, ...] = field(default=(), converter=_sizes)
    gathered: tuple[float, ...] = field(default=(), converter=_sizes)

    def __attrs_post_init__(self) -> None:
        if not len(self.activation) == len(self.kept) == len(self.state):
            raise ValueError("sizes give activation, kept and state for different numbers of stages")
        for name in ("input", "output", "gathered"):
            if getattr(self, name) and len(getattr(self, name)) != len(self.activation):
                raise ValueError(f"sizes give {name} and activation for different numbers of stages")

    @property
    def inputs(self) -> tuple[float, ...]:
        """`input`, one per stage (zeros where not measured)."""
        return self.input or (0.0,) * len(self.activation)

    @property
    def stages(self) -> int:
        return len(self.activation)

    def for_stages(self, stages: int) -> Sizes:
        """The same model cut into `stages` stages (`cuts.carried`: by share of layers)."""
        if stages == self.stages:
            return self

        def carry(values: tuple[float, ...]) -> list[float]:
            return carried(dict(enumerate(values)), self.stages, stages)

        return Sizes(carry(self.activation), carry(self.kept), carry(self.state), carry(self.input) if self.input else (),
                     carry(self.output) if self.output else (), carry(self.gathered) if self.gathered else ())

    def state_of_ranks(self, placement: Sequence[int]) -> list[float]:
        """Per rank, the state bytes of the stages it holds."""
        out = [0.0] * (max(placement, default=-1) + 1)
        for stage, rank in enumerate(placement):
            out[rank] += self.state[stage]
        return out


@frozen
class BytesProfile:
    """Per rank: the peak bytes (state plus the peak of live activations) and its parts."""

    peak: tuple[float, ...]
    activations: tuple[float, ...]
    state: tuple[float, ...]
    peak_step: tuple[int | None, ...]  # per rank: the first step at the activations' peak


def peak_bytes(program: Program, sizes: Sizes) -> BytesProfile:
    """Per rank, its stages' state and its peak live activation bytes under `_deltas`' rule,
    each `F` counting its stage's `activation` bytes and each split backward's `I` keeping
    `kept` of them until its `W`. `sizes` must be for the program's stages."""
    if sizes.stages != program.stages:
        raise ValueError(f"sizes give {sizes.stages} stages, the program has {program.stages}")
    enc = encode(program)
    if enc.invalid:
        raise ValueError("the program has out-of-range actions; check() reports them")
    fast = peaks_from_codes(enc, sizes.activation, kept=sizes.kept, inputs=sizes.input or None,
                            outputs=sizes.output or None, gathered=sizes.gathered or None)
    if fast is None:
        prof = profile(program, sizes.activation, sizes.kept, sizes.input or None, sizes.output or None,
                       sizes.gathered or None)
        fast = list(zip(prof.peak, prof.peak_step))
    state = sizes.state_of_ranks(program.placement)
    state += [0.0] * (program.ranks - len(state))
    return BytesProfile(tuple(a + s for (a, _), s in zip(fast, state)), tuple(a for a, _ in fast), tuple(state),
                        tuple(step for _, step in fast))


@frozen
class Limit:
    """A `--max-memory`: `amount` in `UNIT`, or in bytes when `in_bytes`."""

    amount: float
    in_bytes: bool = False

    def __str__(self) -> str:
        return bytes_text(self.amount) if self.in_bytes else f"{self.amount:g}"


def parse_limit(text: str, max_units: float) -> Limit:
    """`4` (in `UNIT`), `6GiB`, `512MiB`, `1.5GB`, `100KB`, `2e9B`. Raises ValueError with
    the reason in words."""
    m = _AMOUNT.match(text) if len(text) <= 100 else None
    if m is None:
        if text.strip().lower().lstrip("+-") in ("nan", "inf", "infinity"):
            raise ValueError(f"must be a finite number ({UNIT}) or bytes such as 6GiB or 1.5GB, not `{text[:40]}`")
        raise ValueError(f"expected a number ({UNIT}) or bytes such as 6GiB or 1.5GB, not `{text[:40]}`")
    number, suffix = float(m.group(1)), m.group(2)
    if suffix and suffix.lower() not in _UNIT_OF:
        raise ValueError(f"unknown unit `{suffix[:20]}` in `{text[:40]}`: use " + ", ".join(BYTE_UNITS))
    amount = number * BYTE_UNITS[_UNIT_OF[suffix.lower()]] if suffix else number
    top = MAX_BYTES if suffix else max_units
    if amount <= 0:
        raise ValueError(f"must be more than 0, not `{text[:40]}`")
    if not math.isfinite(amount) or amount > top:
        raise ValueError(f"`{text[:40]}` is more than " + (bytes_text(top) if suffix else f"{top:g}"))
    return Limit(amount, bool(suffix))


def bytes_text(n: float) -> str:
    """`1.88 MiB`, `512 B`, `6 GiB`: binary multiples, three significant digits."""
    for name in ("PiB", "TiB", "GiB", "MiB", "KiB"):
        if abs(n) >= BYTE_UNITS[name]:
            return f"{n / BYTE_UNITS[name]:.3g} {name}"
    return f"{n:.0f} B"


def bytes_unit(values: Sequence[float]) -> str:
    """The binary multiple a column of byte figures is printed in (its largest's)."""
    top = max((abs(v) for v in values), default=0.0)
    return next((name for name in ("PiB", "TiB", "GiB", "MiB", "KiB") if top >= BYTE_UNITS[name]), "B")
