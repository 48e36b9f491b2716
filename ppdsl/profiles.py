"""The profile file: what `ppdsl run --profile` writes and `--costs profile.json` reads.

A JSON object (see docs/simulate.md): `ppdsl_profile` (the format version), `unit`, hand-set
`costs`, measured `actions` (averaged per stage and kind into per-stage costs), `stages` and
per-stage `sizes` in bytes; `memory`, `source` and `notes` are free-form. Problems are
`costs.CostError`s naming the offending key, which `cost_sources` locates in the file.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Final

from .costs import COMPUTE_KINDS, UNITS, CostError, CostModel, check_key, check_value
from .ir import Kind
from .limits import MAX_QUANTITY, MAX_STAGES
from .memory import Sizes
from .wording import plural

PROFILE_VERSION: Final = 1


def parse_profile(text: str) -> CostModel:
    """A JSON profile (see docs/simulate.md). Raises CostError; json syntax errors name no key."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CostError("PPS352", f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except ValueError:  # an integer of more digits than Python converts (4300)
        raise CostError("PPS352", "a number in the profile has too many digits") from None
    except RecursionError:
        raise CostError("PPS352", "the profile nests arrays or objects too deeply") from None
    if not isinstance(data, dict):
        raise CostError("PPS352", "a cost profile is a JSON object", help='e.g. {"ppdsl_profile": 1, "costs": {"F": 1}}')
    version = data.get("ppdsl_profile")
    if type(version) is not int or version != PROFILE_VERSION:  # (`true == 1` in Python)
        raise CostError("PPS352", f"`ppdsl_profile` must be {PROFILE_VERSION}, not {_shown(version)}", "ppdsl_profile",
                        help="the first key of a profile names its format version")
    unknown = sorted(set(data) - {"ppdsl_profile", "unit", "costs", "actions", "stages", "sizes", "memory", "source",
                                  "notes"})
    if unknown:
        raise CostError("PPS352", f"unknown profile key `{unknown[0]}`", unknown[0],
                        help="a profile holds ppdsl_profile, unit, costs, actions, stages, sizes "
                             "(and free-form memory, source, notes)")
    unit = data.get("unit", "unit")
    if not isinstance(unit, str) or unit not in UNITS:
        raise CostError("PPS352", f"unknown time unit {_shown(unit)}", "unit", help="use one of " + ", ".join(UNITS))
    items = _aggregate(data.get("actions", []))
    measured_comm = any(key == "comm" for key, _ in items)
    costs = data.get("costs", {})
    if not isinstance(costs, dict):
        raise CostError("PPS352", "`costs` must be an object of KEY: number", "costs")
    for key, value in costs.items():
        check_key(key)
        number = _number(value)
        if number is None:
            raise CostError("PPS351", f"cost `{key}` must be a number, not {_shown(value)}", key)
        items.append((key, number))
    sizes = _sizes(data.get("sizes"))
    stages = _measured_stages(data, items, sizes)
    return CostModel(tuple(items), unit, measured_comm, sizes, stages)


# What a profile's `sizes` holds, per stage, in bytes (`memory.Sizes`).
SIZE_KEYS: Final = ("activation", "kept", "state")
# What a forward keeps beside its saved tensors; a stage's output (and its gradient's) size.
OPTIONAL_SIZE_KEYS: Final = ("input", "output", "gathered")


def _sizes(sizes: object) -> Sizes | None:
    if sizes is None:
        return None
    example = '"sizes": {"activation": [4096, 4096], "kept": [1024, 1024], "state": [8192, 8192]}'
    if not isinstance(sizes, dict) or not set(SIZE_KEYS) <= set(sizes) <= {*SIZE_KEYS, *OPTIONAL_SIZE_KEYS}:
        raise CostError("PPS352", "`sizes` must be an object of " + ", ".join(SIZE_KEYS) + " (and optionally "
                        + ", ".join(OPTIONAL_SIZE_KEYS) + "): bytes per stage", "sizes", help=f"e.g. {example}")
    lists: dict[str, list[float]] = {}
    for key in (*SIZE_KEYS, *(k for k in OPTIONAL_SIZE_KEYS if k in sizes)):
        values = sizes[key]
        if not isinstance(values, list) or not 0 < len(values) <= MAX_STAGES:
            raise CostError("PPS352", f"`sizes.{key}` must be a list of bytes, one per stage (1 to {MAX_STAGES})", key,
                            help=f"e.g. {example}")
        for n, value in enumerate(values):
            number = _number(value)
            if number is None or not math.isfinite(number) or not 0 <= number <= MAX_QUANTITY:
                raise CostError("PPS352", f"`sizes.{key}[{n}]` must be a number of bytes from 0 to {MAX_QUANTITY:g}, "
                                f"not {_shown(value)}", key)
        lists[key] = [float(v) for v in values]
    if len({len(v) for v in lists.values()}) != 1:
        raise CostError("PPS352", "`sizes` lists give different numbers of stages: "
                        + ", ".join(f"{k} {len(v)}" for k, v in lists.items()), "sizes")
    return Sizes(lists["activation"], lists["kept"], lists["state"], lists.get("input", ()), lists.get("output", ()),
                 lists.get("gathered", ()))


def _measured_stages(data: dict[str, object], items: list[tuple[str, float]], sizes: Sizes | None) -> int | None:
    """How many stages the profile measured: `stages`, or what `sizes` or `actions` cover.
    None when nothing says (hand-written `costs` only: their stages are the program's)."""
    stages = data.get("stages")
    if stages is not None and (isinstance(stages, bool) or not isinstance(stages, int) or not 0 < stages <= MAX_STAGES):
        raise CostError("PPS352", f"`stages` must be a whole number from 1 to {MAX_STAGES}, not {_shown(stages)}", "stages")
    if sizes is not None:
        if stages is not None and stages != sizes.stages:
            raise CostError("PPS352", f"`sizes` give {plural(sizes.stages, 'stage')}, `stages` says {stages}", "sizes")
        stages = sizes.stages
    named = [stage for key, _ in items if (stage := check_key(key)[1]) is not None]
    if stages is None and data.get("actions"):
        stages = max(named, default=-1) + 1 or None
    if stages is not None and named and max(named) >= stages:
        key = next(k for k, _ in reversed(items) if check_key(k)[1] == max(named))
        raise CostError("PPS350", f"cost `{key}` names stage {max(named)} but the profile measured "
                        f"{plural(stages, 'stage')}", key)
    return stages


def _number(value: object) -> float | None:
    """A JSON number as a float (an integer too large for one is infinite), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _shown(value: object) -> str:
    """A JSON value for a message, cut short: a profile may hold anything."""
    text = json.dumps(value) if not isinstance(value, int) or abs(value) < 10**30 else "a huge integer"
    return text if len(text) <= 40 else text[:37] + "..."


def _aggregate(actions: object) -> list[tuple[str, float]]:
    """Measured actions -> per-stage mean durations (`F_s0`, `UNSHARD_s0`...) and a mean `comm`
    (present only when the actions hold sends or receives); a `RESHARD` costs nothing. Means, not medians: a step is a sum of
    actions, and the mean of a sum is the sum of the means, noisy machine or not."""
    if not isinstance(actions, list):
        raise CostError("PPS352", "`actions` must be a list of measured actions", "actions")
    compute: dict[tuple[str, int], list[float]] = {}
    comm: list[float] = []
    for n, entry in enumerate(actions):
        where = f"actions[{n}]"
        if not isinstance(entry, dict):
            raise CostError("PPS352", f"{where} must be an object", "actions")
        kind = entry.get("kind")
        duration = entry.get("duration")
        if not isinstance(kind, str) or kind not in Kind.__members__:
            raise CostError("PPS352", f"{where}: unknown kind {_shown(kind)}", "kind",
                            help="one of " + ", ".join(Kind.__members__))
        number = _number(duration)
        if number is None or not math.isfinite(number) or number < 0:
            raise CostError("PPS352", f"{where}: `duration` must be a number >= 0, not {_shown(duration)}", "duration")
        try:
            check_value("duration", number)
        except CostError as exc:
            raise CostError("PPS352", f"{where}: {exc.message}", "duration", exc.help) from None
        k = Kind[kind]
        if k.is_comm:
            comm.append(number)
        elif kind in COMPUTE_KINDS:  # every kind with a cost of its own (a sharded stage's UNSHARD too)
            stage = entry.get("stage")
            if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < MAX_STAGES:
                raise CostError("PPS352", f"{where}: `stage` must be a whole number from 0 to {MAX_STAGES - 1}, "
                                f"not {_shown(stage)}", "stage")
            compute.setdefault((kind, stage), []).append(number)
    items = [(f"{kind}_s{stage}", statistics.fmean(v)) for (kind, stage), v in sorted(compute.items())]
    if comm:
        items.append(("comm", statistics.fmean(comm)))
    return items


def profile_json(costs: Mapping[str, float], unit: str = "unit", actions: Iterable[Mapping[str, object]] = (),
                 memory: Iterable[Mapping[str, object]] = (), sizes: Sizes | None = None) -> str:
    """A profile file's text: what the runtime writes from measured times and sizes (and, per
    rank, the memory it measured: informative, the simulator does not read it)."""
    data: dict[str, object] = {"ppdsl_profile": PROFILE_VERSION, "unit": unit}
    if costs:
        data["costs"] = dict(costs)
    acts = list(actions)
    if acts:
        data["actions"] = acts
    if sizes is not None:
        data["stages"] = sizes.stages
        data["sizes"] = {"activation": [round(v) for v in sizes.activation], "kept": [round(v) for v in sizes.kept],
                         "state": [round(v) for v in sizes.state],
                         **({"input": [round(v) for v in sizes.input]} if any(sizes.input) else {}),
                         **({"output": [round(v) for v in sizes.output]} if any(sizes.output) else {}),
                         **({"gathered": [round(v) for v in sizes.gathered]} if any(sizes.gathered) else {})}
    mem = list(memory)
    if mem:
        data["memory"] = mem
    return json.dumps(data, indent=2) + "\n"
