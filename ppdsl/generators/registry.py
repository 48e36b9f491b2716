"""The generator registry: an explicit table, argument checking, and one `expand` entry point.

A generator is a small module that exposes `SPEC`, a `GeneratorSpec`. Its `build` receives the
header's ranks and microbatches plus already type-checked arguments (defaults filled in) and
returns compute-only rows; its `steps` says how many steps those rows hold, exactly, without
building them (a program past its limit is refused before it exists). A generator that reads
more of the file than its sizes (the search reads the `costs` line) builds from the whole
`Context` instead (`build_in`). Constraint violations are raised as `GeneratorError` naming the
argument, so the `use` line's expansion (`ppdsl/expansion.py`) can point at it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Union

from attrs import frozen

from ..wording import did_you_mean
from ..ir import Action, Kind, Step, actions_of

ArgValue = Union[int, float, str]


class GeneratorError(Exception):
    def __init__(self, code: str, message: str, argument: str | None = None, help: str | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.argument = argument
        self.help = help


@frozen
class Param:
    name: str
    type: type[int] | type[float] | type[str]
    default: ArgValue
    doc: str
    minimum: int | float | None = None
    choices: tuple[str, ...] = ()


@frozen
class Built:
    rows: tuple[tuple[Step, ...], ...]
    stages: int
    placement: tuple[int, ...]


@frozen
class Context:
    """What a `use` line's generator runs with besides its arguments: the header's sizes and
    mode, and the file's `costs` line."""

    ranks: int
    microbatches: int
    inference: bool = False
    costs: tuple[tuple[str, float], ...] = ()


Build = Callable[[int, int, Mapping[str, ArgValue]], Built]
BuildIn = Callable[[Context, Mapping[str, ArgValue]], Built]
# (ranks, microbatches, checked arguments, inference) -> the steps `build` makes, counted in
# O(ranks) at most: never sized by anything.
Count = Callable[[int, int, Mapping[str, ArgValue], bool], int]


def every_slot(per_slot: int, stages_per_rank: int = 1, virtual: str | None = None) -> Count:
    """The count of a generator that gives every (stage, microbatch) `per_slot` actions in
    training (F and B: 2; F, I and W: 3) and one forward in inference, on `stages_per_rank`
    stages a rank, or as many as its argument `virtual` says."""

    def count(ranks: int, microbatches: int, args: Mapping[str, ArgValue], inference: bool) -> int:
        stages = ranks * (int(args[virtual]) if virtual is not None else stages_per_rank)
        return stages * microbatches * (1 if inference else per_slot)

    return count


@frozen
class GeneratorSpec:
    name: str
    summary: str
    placement: str
    build: Build
    # None: counted only once built (the search, which has a bound of its own).
    steps: Count | None
    params: tuple[Param, ...] = ()
    aliases: tuple[str, ...] = ()
    reference: str = ""
    # Set where the generator reads more than the sizes (the search: the costs line); `build`
    # is then the same generator without what the file adds.
    build_in: BuildIn | None = None


# Explicit, in the order `ppdsl` lists them.
MODULES = (
    "gpipe",
    "one_f_one_b",
    "interleaved",
    "looped_bfs",
    "zero_bubble",
    "zbv",
    "v_schedules",
    "dualpipev",
    "pipeoffload",
)


def _load() -> dict[str, GeneratorSpec]:
    table: dict[str, GeneratorSpec] = {}
    for name in MODULES:
        # A name listed here without its module is a packaging bug: let the import fail loudly.
        module = importlib.import_module(f"{__package__}.{name}")
        for s in getattr(module, "SPECS", None) or (module.SPEC,):
            table[s.name] = s
    return table


def canonical_name(name: str) -> str:
    return ALIASES.get(name, name)


def lookup(name: str, table: Mapping[str, GeneratorSpec] | None = None) -> GeneratorSpec:
    """The generator `name` (or an alias) in `table` (default: the registry's own)."""
    table = REGISTRY if table is None else table
    spec = table.get(canonical_name(name))
    if spec is None:
        names = sorted([*table, *ALIASES])
        raise GeneratorError("PPS020", f"unknown generator `{name}`", help=f"{did_you_mean(name, names)}known: {', '.join(names)}")
    return spec


def check_arguments(spec: GeneratorSpec, args: Mapping[str, object]) -> dict[str, ArgValue]:
    params = {p.name: p for p in spec.params}
    values: dict[str, ArgValue] = {p.name: p.default for p in spec.params}
    for key, value in args.items():
        param = params.get(key)
        if param is None:
            valid = ", ".join(f"{p.name} ({p.doc})" for p in spec.params) or "none"
            raise GeneratorError("PPS021", f"`{spec.name}` has no argument `{key}`", key,
                                 help=f"{did_you_mean(key, params)}valid arguments: {valid}")
        if param.type is float and isinstance(value, int):
            value = float(value)
        if not isinstance(value, param.type) or isinstance(value, bool):
            raise GeneratorError("PPS022", f"`{key}` must be {param.type.__name__}, not `{value}`", key)
        if param.choices and value not in param.choices:
            raise GeneratorError("PPS022", f"`{key}` must be one of {', '.join(param.choices)}, not `{value}`", key)
        if param.minimum is not None and value < param.minimum:  # type: ignore[operator]
            raise GeneratorError("PPS022", f"`{key}` must be at least {param.minimum}, not {value}", key)
        values[key] = value
    return values


def expand(name: str, ranks: int, microbatches: int, args: Mapping[str, object], inference: bool = False) -> Built:
    """Run generator `name`; raise GeneratorError (PPS020-022) on any problem.

    For an inference program the generator's schedule is kept with its backward work removed:
    the forwards keep their relative order, which is all a forward-only run needs.
    """
    return run(lookup(name), Context(ranks, microbatches, inference), args)


#: What every generator takes besides its own arguments.
RECOMPUTE = Param("recompute", str, "none",
                  "all, none, or N: how many microbatches of each stage's in-flight window recompute (an R "
                  "just before the first backward)")


OFFLOAD = Param("offload", str, "none",
                "all, none, or N: how many microbatches of each stage's in-flight window move their activations "
                "to host memory (an OFFLOAD right after the forward, a RELOAD just before the first backward)")


def memory_args(args: Mapping[str, object]) -> tuple[dict[str, object], int | None, int | None]:
    """`args` without `recompute` and `offload`, and how many of each in-flight window each
    takes (None: none; a number at least the window: all)."""
    own = dict(args)
    counts: list[int | None] = []
    for param in (RECOMPUTE, OFFLOAD):
        value = own.pop(param.name, "none")
        if value == "none":
            counts.append(None)
        elif value == "all":
            counts.append(ALL)
        elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            counts.append(value or None)
        else:
            raise GeneratorError("PPS022", f"`{param.name}` must be all, none or a count of microbatches, not "
                                 f"`{value}`", param.name)
    return own, counts[0], counts[1]


ALL = 1 << 62
MEMORY_KINDS = frozenset({Kind.R, Kind.OFFLOAD, Kind.RELOAD})


def _windows(row: tuple[Step, ...]) -> dict[int, int]:
    """Per stage, the most forwards of it the row has run and not yet started backward on."""
    window: dict[int, int] = {}
    open_: dict[int, set[int]] = {}
    for step in row:
        for a in actions_of(step):
            if a.microbatch is None:
                continue
            if a.kind is Kind.F:
                open_.setdefault(a.stage, set()).add(a.microbatch)
                window[a.stage] = max(window.get(a.stage, 0), len(open_[a.stage]))
            elif a.kind in (Kind.B, Kind.I):
                open_.get(a.stage, set()).discard(a.microbatch)
    return window


def with_memory_actions(built: Built, recompute: int | None, offload: int | None) -> Built:
    """`built` with, for the first `recompute` microbatches of each in-flight window of each
    stage (microbatch m when m mod window < recompute), an `R` just before the first backward
    of (s, m) in its row; and for the first `offload` of the others, an `OFFLOAD` right after
    the forward and a `RELOAD` just before the first backward. A (stage, microbatch) that the
    generator itself recomputes or moves (`pipeoffload`) is left as it placed it."""
    rows = []
    for row in built.rows:
        window = _windows(row)
        placed = {(a.stage, a.microbatch) for step in row for a in actions_of(step) if a.kind in MEMORY_KINDS}

        def takes(a: Action, count: int | None) -> bool:
            return count is not None and a.microbatch is not None and a.microbatch % window[a.stage] < count \
                and (a.stage, a.microbatch) not in placed

        out: list[Step] = []
        seen: set[tuple[int, int]] = set()
        for step in row:
            before: list[Step] = []
            after: list[Step] = []
            for a in actions_of(step):
                if a.microbatch is None:
                    continue
                moved = not takes(a, recompute) and takes(a, offload)
                if a.kind is Kind.F and moved:
                    after.append(Action(a.stage, Kind.OFFLOAD, a.microbatch))
                key = (a.stage, a.microbatch)
                if a.kind in (Kind.B, Kind.I) and key not in seen:
                    seen.add(key)
                    if takes(a, recompute):
                        before.append(Action(a.stage, Kind.R, a.microbatch))
                    elif moved:
                        before.append(Action(a.stage, Kind.RELOAD, a.microbatch))
            out.extend(before)
            out.append(step)
            out.extend(after)
        rows.append(tuple(out))
    return Built(tuple(rows), built.stages, built.placement)


def run(spec: GeneratorSpec, context: Context, args: Mapping[str, object]) -> Built:
    """Run `spec` in `context`; raise GeneratorError (PPS021-022) on any problem."""
    args, recompute, offload = memory_args(args)
    values = check_arguments(spec, args)
    if spec.build_in is not None:
        built = spec.build_in(context, values)
    else:
        built = spec.build(context.ranks, context.microbatches, values)
    if len(built.rows) != context.ranks or len(built.placement) != built.stages:  # pragma: no cover - generator bug
        raise AssertionError(f"generator {spec.name} built a malformed program")
    if context.inference:
        built = Built(tuple(forwards_only(row) for row in built.rows), built.stages, built.placement)
    elif recompute is not None or offload is not None:
        built = with_memory_actions(built, recompute, offload)
    return built


def count(name: str, ranks: int, microbatches: int, args: Mapping[str, object], inference: bool = False) -> int | None:
    """The steps `expand` would make, without making them (None where only building tells);
    raises GeneratorError as `expand` does for an unknown generator or a bad argument."""
    return steps_of(lookup(name), Context(ranks, microbatches, inference), args)


def steps_of(spec: GeneratorSpec, context: Context, args: Mapping[str, object]) -> int | None:
    args, recompute, offload = memory_args(args)
    values = check_arguments(spec, args)
    if spec.steps is None:
        return None
    steps = spec.steps(context.ranks, context.microbatches, values, context.inference)
    if (recompute is None and offload is None) or context.inference:
        return steps
    # At most two memory actions per forward, and every forward has a backward: a bound.
    return steps + steps


def forwards_only(row: tuple[Step, ...]) -> tuple[Step, ...]:
    out: list[Step] = []
    for step in row:
        for action in actions_of(step):
            if action.kind is Kind.F:
                out.append(action)
    return tuple(out)


def require(condition: bool, message: str, argument: str | None = None, help: str | None = None) -> None:
    """For generators: state a constraint and its numbers in one line."""
    if not condition:
        raise GeneratorError("PPS022", message, argument, help)


# Built last: the generator modules import `require` and the classes above from this module.
REGISTRY: dict[str, GeneratorSpec] = _load()
ALIASES: dict[str, str] = {alias: s.name for s in REGISTRY.values() for alias in s.aliases}
