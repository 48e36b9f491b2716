"""Where a program's costs come from: its own `costs` line, then each `--costs` argument
(inline `K=V,...` or a profile file), with a problem located in the input that holds it."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from .costs import CostError, CostModel, NotCosted, ShapeError, parse_inline
from .diagnostics import Diagnostic, PpsError, UsageError
from .files import read_text
from .ir import Program
from .profiles import parse_profile


def _costs_location(program: Program, key: str | None) -> tuple[str, int, int, int | None]:
    """(path, line, column, end column) of `key=` on the program's `costs` line (of the line
    when it does not write `key`; of the header when the file has no such line)."""
    source = program.source
    if source is None:
        return "<input>", 1, 1, None
    span = source.cost_spans.get(key) if key is not None else None
    if span is not None:
        return source.path, span.line, span.column, span.end_column
    where = source.costs_line or source.header
    return source.path, where.line, where.column, None


def from_program(program: Program) -> CostModel:
    """The program's own `costs` line, validated; problems raise PpsError located on that line."""
    try:
        model = CostModel(program.costs)
        model.table(program.stages)
        return model
    except CostError as exc:
        path, line, col, end = _costs_location(program, exc.key)
        raise PpsError([Diagnostic(exc.code, exc.message, path, line, col, end, help=exc.help)]) from None


def _json_location(text: str, key: str | None) -> tuple[int, int]:
    if key is not None:
        m = re.search(rf'"{re.escape(key)}"\s*:', text)
        if m:
            line = text.count("\n", 0, m.start()) + 1
            return line, m.start() - (text.rfind("\n", 0, m.start()) + 1) + 1
    return 1, 1


def load_costs(spec: str, stages: int, fit: bool = True) -> CostModel:
    """A `--costs` argument: inline `K=V,...` or the path of a JSON profile, for a program
    of `stages` stages: a profile measured on another number of stages is carried over to
    it (`CostModel.fitted`) unless `fit` is False (the search carries over itself).

    A bad inline value is a usage error (exit 2); a bad profile file is a problem in an input
    file (PpsError located in it, exit 1).
    """
    if not spec.strip():
        raise UsageError("--costs: empty; give costs such as F=1,B=2,comm=0.1 or a .json profile file")
    looks_like_file = spec.endswith(".json") or ("=" not in spec)
    if not looks_like_file:
        try:
            model = parse_inline(spec)
            model.table(stages)
            return model
        except CostError as exc:
            raise UsageError(f"--costs: {exc.message}" + (f" ({exc.help})" if exc.help else "")) from None
    try:
        exists = Path(spec).exists()
    except OSError:  # (a name too long for the file system is no file either)
        exists = False
    if not spec.endswith(".json") and not exists:
        shown = spec if len(spec) <= 60 else spec[:57] + "..."
        raise UsageError(f"--costs {shown}: neither costs such as F=1,B=2,comm=0.1 nor a profile file")
    try:
        text = read_text(spec)
    except UsageError as exc:
        raise UsageError(f"--costs {exc}") from None
    try:
        model = parse_profile(text)
        if fit:
            model = model.fitted(stages)
        model.table(model.stages or stages)
        return model
    except CostError as exc:
        line, col = _json_location(text, exc.key)
        found = [Diagnostic(exc.code, exc.message, spec, line, col, help=exc.help)]
        if isinstance(exc, ShapeError):
            raise NotCosted(found, exc.message) from None
        raise PpsError(found) from None


def resolve(program: Program, specs: Iterable[str] = ()) -> CostModel:
    """The program's `costs` line overridden, in order, by each `--costs` argument."""
    model = from_program(program)
    for spec in specs:
        model = model.merged(load_costs(spec, program.stages))
    return model


