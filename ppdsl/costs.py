"""The cost model: how long each action takes, for the simulator.

Keys (the same on the `.pps` `costs` line, after `--costs`, and in a profile's `"costs"`):

- `F`, `B`, `I`, `W`: the duration of a forward, a full backward, a backward-input and a
  backward-weight. Missing kinds follow the usual ratio: `I` and `W` each cost what `F` costs
  and `B` costs `I + W`; a `B` given alone splits evenly into `I` and `W`. So `F=1` alone
  means `B=2`, and `F=1 B=3 W=1` means `I=2`.
  These are the times of one rank's share of the model: when a rank holds several stages
  (interleaved and V schedules), each of its stages takes its share of them, so `F=1` costs
  a 1F1B stage 1 and a ZB-V stage 0.5, and schedules compare on the same model.
- `F_s3=1.5` (any kind, `_s` and a stage number): that stage only, as given (not shared out);
  the same rules apply per stage.
- `comm`: the latency of one message (a send/receive pair, or one hand-off between ranks in
  a program without explicit communication). `bytes` and `bandwidth` (bytes per time unit)
  add `bytes / bandwidth` to every message.
- `R`, `OFFLOAD`, `RELOAD`: a recompute (default: what `F` costs) and a move of one
  microbatch's activations to host memory and back. Moves run on the rank's copy lane,
  beside its computes; a backward waits for the reload of its activations. Without a time
  of their own they take the stage's activation bytes (a profile's sizes) over `offload_bw`
  (bytes per time unit), else nothing.
- `UNSHARD`, `REDUCE_GRAD`: a sharded stage's all-gather of its weights and reduction of its
  gradients (default: nothing). They run on the copy lane too; the stage's next compute waits
  for its `UNSHARD`, and the step ends once its last `REDUCE_GRAD` has.
- `copy_lane`: 1 (the default) runs offloads, reloads and the sharding collectives on a copy
  lane beside the computes; 0 has each rank run them itself, in row order, as `ppdsl run` does
  (its profile says so).
- `overlap`: for an overlapped pair `(F;B)`, the fraction of the shorter part hidden under the
  longer one: 0 (the default) makes the pair cost the sum of its parts, which is what a runtime
  that runs them one after the other (ppdsl's own) takes; 1 the longer of the two, for a
  runtime that really overlaps them (compute of one with communication of the other).

Durations are in one unit of your choosing; a profile file can name it (`"unit": "ms"`).
A JSON profile holds measured times (`profiles.py`); where a program's costs come from, and
how a problem is located there, is `cost_sources.py`. Problems are `CostError`s carrying a
PPS35x code and the offending key, which the caller turns into a located diagnostic.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Final

from attrs import field, frozen

from .cuts import carried, carries
from .diagnostics import Diagnostic, PpsError
from .ir import Kind, Overlap, Program
from .kinds import TABLE
from .limits import MAX_COST, MAX_QUANTITY, MAX_STAGES, MIN_COST
from .memory import Sizes
from .semantics import Timing
from .wording import plural

# The compute kinds' cost keys, from the table of kinds (`ppdsl/kinds.py`, each row's `cost`):
# F, B, I, W, a full backward before its halves.
COMPUTE_KINDS: Final[tuple[str, ...]] = TABLE.cost_keys
GLOBAL_KEYS: Final = ("comm", "bytes", "bandwidth", "overlap", "offload_bw", "copy_lane")  # `comm`: every send's and receive's
# At most as many digits as MAX_STAGES has: a longer number is no stage (and int() of a
# 5000-digit string is an error of its own).
_STAGE_KEY = re.compile(rf"^({'|'.join(map(re.escape, COMPUTE_KINDS))})_s(\d{{1,{len(str(MAX_STAGES))}}})$")
UNITS: Final[dict[str, float]] = {"unit": 1e3, "s": 1e6, "ms": 1e3, "us": 1.0}  # -> microseconds per unit


class CostError(Exception):
    """A cost key or value that cannot be used. `key` is None for a problem with the whole input."""

    def __init__(self, code: str, message: str, key: str | None = None, help: str | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.key = key
        self.help = help


class ShapeError(CostError):
    """A profile's per-stage costs that do not carry over to the program's stages."""


class NotCosted(PpsError):
    """`ShapeError` located in the profile: the program cannot be costed with it (a
    comparison keeps its column and says why: `reason`)."""

    def __init__(self, diagnostics: list[Diagnostic], reason: str):
        super().__init__(diagnostics)
        self.reason = reason


def check_key(key: str) -> tuple[str, int | None]:
    """(kind or global key, stage or None) of a valid key."""
    if key in COMPUTE_KINDS or key in GLOBAL_KEYS:
        return key, None
    m = _STAGE_KEY.match(key)
    if m:
        return m.group(1), int(m.group(2))
    hint = f"{', '.join(COMPUTE_KINDS)} (optionally per stage as {COMPUTE_KINDS[0]}_s3), {', '.join(GLOBAL_KEYS)}"
    lower = key.upper() if key.upper() in COMPUTE_KINDS else None
    raise CostError("PPS350", f"unknown cost `{key}`", key,
                    help=f"did you mean `{lower}`? " * (lower is not None) + f"known costs: {hint}")


def check_value(key: str, value: float) -> None:
    if not math.isfinite(value) or value < 0:
        raise CostError("PPS351", f"cost `{key}={value:g}` must be a finite number >= 0", key)
    top = MAX_QUANTITY if key in ("bytes", "bandwidth", "offload_bw") else MAX_COST
    if value > top:
        raise CostError("PPS351", f"cost `{key}={value:g}` is larger than {top:g}", key,
                        help="ppdsl's limit: past it the sums of a simulation are no longer times")
    if 0 < value < MIN_COST:
        raise CostError("PPS351", f"cost `{key}={value:g}` is smaller than {MIN_COST:g} but not 0", key,
                        help="write 0 for free, or pick a smaller time unit")
    if key in ("bandwidth", "offload_bw") and value == 0:
        raise CostError("PPS351", f"`{key}` must be greater than 0", key)
    if key == "copy_lane" and value not in (0, 1):
        raise CostError("PPS351", f"`copy_lane={value:g}` is 1 (offloads and reloads beside the computes) or 0 "
                        "(each run by its rank in row order)", key)
    if key == "overlap" and value > 1:
        raise CostError("PPS351", f"`overlap={value:g}` is a fraction between 0 and 1", key,
                        help="1: an overlapped pair costs the longer part; 0: the sum of both")


def _pairs(items: Mapping[str, float] | Iterable[tuple[str, float]]) -> tuple[tuple[str, float], ...]:
    """`items` as (key, value) pairs: a mapping (`{"F": 1, "B": 2}`) is taken as its items; a
    sequence must hold pairs."""
    pairs = tuple(items.items()) if isinstance(items, Mapping) else tuple(items)
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
            raise CostError("PPS351", f"costs are (key, value) pairs or a mapping such as {{'F': 1, 'B': 2}}, "
                            f"not {pair!r} in {items!r}"[:300], None)
    return pairs


@frozen
class CostModel:
    """Validated cost keys in the order given (later ones win), and the time unit's name.

    `measured_comm`: the `comm` time was measured on explicit sends and receives (a runtime
    profile), which occupy both ranks; a compute-only program is then simulated lowered
    (`lowered_for`), as the runtime runs it, so that the measured time lands where it was spent.

    `sizes`: bytes per stage (a runtime profile's), for memory in bytes. `stages`: how many
    stages the per-stage keys and sizes describe, when they were measured on a program of
    their own (a profile); `fitted` carries them over to another program's stages, and
    `carried_from` says from how many they came. None: the program's own stages.
    """

    items: tuple[tuple[str, float], ...] = field(default=(), converter=_pairs)
    unit: str = "unit"
    measured_comm: bool = False
    sizes: Sizes | None = None
    stages: int | None = None
    carried_from: int | None = None
    _values: dict[str, float] = field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        values: dict[str, float] = {}
        for key, value in self.items:
            check_key(key)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise CostError("PPS351", f"cost `{key}` must be a number, not {value!r}", key)
            check_value(key, value)
            values[key] = float(value)
        if "bytes" in values and "bandwidth" not in values:
            raise CostError("PPS351", "`bytes` needs a `bandwidth` to turn it into time", "bytes",
                            help="e.g. bytes=4194304 bandwidth=2.6e6 (bytes per time unit)")
        if "bytes" in values and values["bytes"] / values["bandwidth"] > MAX_COST:
            raise CostError("PPS351", f"`bytes / bandwidth` is larger than {MAX_COST:g} time units", "bytes",
                            help="bandwidth is in bytes per time unit")
        if self.unit not in UNITS:
            raise CostError("PPS352", f"unknown time unit `{self.unit}`", None, help="use one of " + ", ".join(UNITS))
        object.__setattr__(self, "_values", values)

    def merged(self, other: CostModel) -> CostModel:
        """These costs overridden by `other`'s keys (and its unit when it names one)."""
        unit = other.unit if other.unit != "unit" else self.unit
        return CostModel(self.items + other.items, unit, self.measured_comm or other.measured_comm,
                         other.sizes or self.sizes, other.stages or self.stages, other.carried_from or self.carried_from)

    def fitted(self, stages: int) -> CostModel:
        """These costs for a program of `stages` stages: per-stage keys and sizes measured on
        another number of stages carried over by share of layers (`reshape`). Raises CostError
        (PPS350) when neither count divides the other."""
        given = self.stages
        if given is None or given == stages:
            return self
        if not carries(given, stages):
            raise ShapeError("PPS350", f"the profile measured {plural(given, 'stage')}; its per-stage costs do not carry "
                            f"over to {plural(stages, 'stage')}", "stages",
                            help="one count must divide the other (each stage then holds a share of a measured one, "
                                 "or several whole ones): profile a run of this shape")
        shaped = reshape(self, given, stages)
        sizes = self.sizes.for_stages(stages) if self.sizes is not None else None
        return CostModel(shaped.items, self.unit, self.measured_comm, sizes, stages, given)

    def get(self, key: str) -> float | None:
        return self._values.get(key)

    @property
    def effective(self) -> tuple[tuple[str, float], ...]:
        """Each key once, with the value that wins (the last given), in the order first given."""
        return tuple(self._values.items())

    def check_stages(self, stages: int) -> None:
        for key in self._values:
            _, stage = check_key(key)
            if stage is not None and stage >= stages:
                raise CostError("PPS350", f"cost `{key}` names stage {stage} but the program has {plural(stages, 'stage')}",
                                key, help=f"stages are numbered 0..{stages - 1}")

    def kind_costs(self, stage: int | None = None, share: float = 1.0) -> dict[str, float]:
        """F, B, I and W for one stage (or for every stage without a per-stage key). `share`
        scales what is given for a rank's whole share of the model (the global keys and the
        default F=1), not a per-stage key, before the missing kinds are derived: a `B` made
        of per-stage `I` and `W` is that stage's own."""
        given = {k: v * share for k, v in self._values.items() if k in COMPUTE_KINDS}
        if stage is not None:
            for kind in COMPUTE_KINDS:
                v = self._values.get(f"{kind}_s{stage}")
                if v is not None:
                    given[kind] = v
        f = given.get("F", share)
        if "B" in given:
            b = given["B"]
            i = given.get("I", b - given["W"] if "W" in given else b / 2)
            w = given.get("W", b - i)
            if i < 0 or w < 0:
                # Only a given I or W can exceed B (a missing one is what B leaves): cite that one.
                part = "I" if given.get("I", 0.0) > b else "W"

                def named(kind: str) -> str:  # the key as the user wrote it
                    return f"{kind}_s{stage}" if f"{kind}_s{stage}" in self._values else kind

                raise CostError("PPS351", f"`{named('B')}={self._values[named('B')]:g}` is less than "
                                f"`{named(part)}={self._values[named(part)]:g}`",
                                named("B"), help="B is a full backward: it costs at least as much as I or W alone")
        else:
            i = given.get("I", f)
            w = given.get("W", f)
            b = i + w
        # A recompute is the forward again. Moving activations (on the copy lane) costs what is
        # given, else the stage's activation bytes (a profile's sizes) over `offload_bw`, else
        # nothing.
        moved = 0.0
        bw = self._values.get("offload_bw")
        if bw and stage is not None and self.sizes is not None and stage < self.sizes.stages:
            moved = self.sizes.activation[stage] / bw
        return {"F": f, "B": b, "I": i, "W": w, "R": given.get("R", f), "OFFLOAD": given.get("OFFLOAD", moved),
                "RELOAD": given.get("RELOAD", moved), "UNSHARD": given.get("UNSHARD", 0.0),
                "REDUCE_GRAD": given.get("REDUCE_GRAD", 0.0)}

    def table(self, stages: int, shares: Sequence[int] | None = None) -> list[tuple[float, ...]]:
        """Per stage, the duration of each compute Kind, indexed by Kind value (non-compute: 0).

        `shares[s]` is how many stages stage s's rank holds (see `shares_of`): a cost given for
        the whole model share of a rank is divided among them; a per-stage key is taken as is.
        """
        self.check_stages(stages)
        out = []
        for s in range(stages):
            c = self.kind_costs(s, 1.0 if shares is None else 1.0 / shares[s])
            row = [0.0] * (max(Kind) + 1)  # indexed by kind value
            for kind in COMPUTE_KINDS:
                row[Kind[kind]] = c[kind]
            out.append(tuple(row))
        return out

    @property
    def message_time(self) -> float:
        t = self._values.get("comm", 0.0)
        if "bytes" in self._values:
            t += self._values["bytes"] / self._values["bandwidth"]
        return t

    @property
    def copy_lane(self) -> bool:
        """Whether offloads and reloads run on a copy lane beside the computes (`copy_lane=1`,
        the default: a side stream) or each on its rank in row order (`copy_lane=0`)."""
        return self._values.get("copy_lane", 1.0) != 0

    @property
    def overlap_fraction(self) -> float:
        return self._values.get("overlap", 0.0)

    def pair_time(self, a: float, b: float) -> float:
        """An overlapped pair whose parts cost a and b."""
        return a + b - self.overlap_fraction * min(a, b)

    def timing(self, stages: int, shares: Sequence[int] | None = None) -> Timing:
        """The same durations in the form semantics.execute takes: a table per stage and Kind,
        which the engine reads directly (no call per action)."""
        table = self.table(stages, shares)

        def overlap(step: Overlap) -> float:
            x, y = (table[p.stage][p.kind] if 0 <= p.stage < stages else 0.0 for p in step.parts)
            return self.pair_time(x, y)

        return Timing.from_table(table, self.message_time, overlap, self.copy_lane)

    def describe(self, stages: int, kinds: Collection[str] | None = None, overlap: bool = True) -> dict[str, float]:
        """The effective costs, as a flat dict for reports (per-stage keys only where they differ).

        With `kinds` (and `overlap`), what a program has (`simulate.applying_to`): only the
        costs that apply to it. A kind's global value then appears when some stage takes it,
        or as the one value when every stage has the same (a profile measures every stage)."""
        base = self.kind_costs()
        per_stage = [self.kind_costs(s) for s in range(stages)]
        shown = [k for k in COMPUTE_KINDS if kinds is None or k in kinds]
        out: dict[str, float] = {}
        for kind in shown:
            values = {c[kind] for c in per_stage}
            if kinds is None or base[kind] in values:
                out[kind] = base[kind]
            elif len(values) == 1:
                out[kind] = values.pop()
        for s, c in enumerate(per_stage):
            for kind in shown:
                if c[kind] != out.get(kind):
                    out[f"{kind}_s{s}"] = c[kind]
        out["comm"] = self.message_time
        if overlap:
            out["overlap"] = self.overlap_fraction
        if not self.copy_lane:
            out["copy_lane"] = 0.0
        return out


DEFAULT: Final = CostModel()


def shares_of(program: Program) -> list[int]:
    """Per stage, how many stages its rank holds: the share of the rank's time each one takes."""
    per_rank: dict[int, int] = {}
    for rank in program.placement:
        per_rank[rank] = per_rank.get(rank, 0) + 1
    return [per_rank[rank] for rank in program.placement]


def reshape(costs: CostModel, given: int, stages: int) -> CostModel:
    """Per-stage costs measured on `given` equal cuts of the model, for `stages` equal cuts.

    Stage s of `stages` holds a share of one cut (when there are more stages than cuts) or
    the sum of the cuts it holds (when fewer), as `cuts.carried` says: a model whose first
    layers are heavier stays so whatever the shape.
    """
    if given in (0, stages):
        return costs
    plain = tuple((k, v) for k, v in costs.items if "_s" not in k)
    per: dict[tuple[str, int], float] = {}
    for key, value in costs.items:
        head, sep, tail = key.partition("_s")
        if sep:
            per[(head, int(tail))] = value
    items = list(plain)
    base = costs.kind_costs()
    for kind in COMPUTE_KINDS:
        measured = {stage: v for (k, stage), v in per.items() if k == kind}
        if not measured:
            continue
        # A cut nothing names costs its share of the global value: a rank's share over the
        # cuts a rank holds (given // ranks, and ranks is the smaller of the two counts).
        default = base[kind] * min(given, stages) / given
        items.extend((f"{kind}_s{s}", v) for s, v in enumerate(carried(measured, given, stages, default)))
    return CostModel(tuple(items), costs.unit)


def parse_inline(text: str) -> CostModel:
    """`F=1,B=2,W=1,comm=0.1` (commas or blanks between items). Raises CostError."""
    items: list[tuple[str, float]] = []
    for part in re.split(r"[,\s]+", text.strip()):
        if not part:
            continue
        key, eq, value = part.partition("=")
        if not eq or not key:
            raise CostError("PPS351", f"`{part}` is not KEY=VALUE", key or None, help="e.g. --costs F=1,B=2,comm=0.1")
        check_key(key)
        try:
            number = float(value)
        except ValueError:
            raise CostError("PPS351", f"cost `{key}` must be a number, not `{value}`", key) from None
        if not math.isfinite(number):  # 1e400 reads as inf: say what was typed
            raise CostError("PPS351", f"cost `{part}` must be a finite number >= 0", key)
        items.append((key, number))
    if not items:
        raise CostError("PPS351", "no costs given", None, help="e.g. --costs F=1,B=2,comm=0.1")
    return CostModel(tuple(items))
