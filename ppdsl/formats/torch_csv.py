"""PyTorch's schedule CSV (`torch.distributed.pipelining` `_load_csv` / `_dump_csv`).

One row per rank, one comma-separated cell per step, an empty cell for an idle step. Stage
placement is not written: it follows from which row holds a stage.

Two dialects, told apart by their tables only:
- current: `I` is backward-input, `B` a full backward;
- legacy: `B` is backward-input when a `W` for the same stage and microbatch follows, and
  `BW` is a full backward.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import ClassVar

from ..diagnostics import Diagnostic, PpsError, Severity
from ..english import plural
from ..ir import IDLE, KIND_BY_NAME, Action, Batch, Idle, Kind, Overlap, Program, Segment, SourceMap, Span, Step
from ..placement import infer

_CELL_RE = re.compile(r"(\d+)([A-Z_]+)(\d*)\Z")
_OVERLAP_RE = re.compile(r"\(([^;()]*);([^;()]*)\)(?:OVERLAP_F_B)?\Z")


class CurrentDialect:
    name: ClassVar[str] = "current"
    # Kind written in the file -> Kind in the IR, and back.
    read_names: ClassVar[dict[str, Kind]] = dict(KIND_BY_NAME)
    write_names: ClassVar[dict[Kind, str]] = {k: k.name for k in Kind}

    @classmethod
    def resolve(cls, actions: list[Action]) -> list[Action]:
        return actions


class LegacyDialect(CurrentDialect):
    name = "legacy"
    read_names = {**{k: v for k, v in CurrentDialect.read_names.items() if k != "I"}, "BW": Kind.B}
    write_names = {**CurrentDialect.write_names, Kind.I: "B", Kind.B: "BW"}

    @classmethod
    def resolve(cls, actions: list[Action]) -> list[Action]:
        # Legacy `B` means backward-input exactly when a `W` for it exists; it was parsed as
        # the placeholder Kind.I and a lone one is a full backward.
        with_w = {(a.stage, a.microbatch) for a in actions if a.kind is Kind.W}
        return [a if a.kind is not Kind.I or (a.stage, a.microbatch) in with_w else Action(a.stage, Kind.B, a.microbatch)
                for a in actions]


DIALECTS: dict[str, type[CurrentDialect]] = {"current": CurrentDialect, "legacy": LegacyDialect}


def detect_dialect(cells: Iterable[str]) -> type[CurrentDialect]:
    """Legacy when a cell says `BW`, or a `B` has a matching `W`; current otherwise."""
    backward: set[tuple[str, str]] = set()
    weight: set[tuple[str, str]] = set()
    for cell in cells:
        for part in re.findall(r"\d+[A-Z_]+\d*", cell):
            m = _CELL_RE.match(part)
            if m is None:
                continue
            if m.group(2) == "BW":
                return LegacyDialect
            if m.group(2) == "B":
                backward.add((m.group(1), m.group(3)))
            elif m.group(2) == "W":
                weight.add((m.group(1), m.group(3)))
    return LegacyDialect if backward & weight else CurrentDialect


def _error(path: str, line: int, column: int, message: str, help: str | None = None) -> PpsError:
    return PpsError([Diagnostic("PPS030", message, path, line, column, help=help)])


def read_csv(text: str, path: str = "<input>", dialect: str | None = None) -> Program:
    """A PyTorch schedule CSV -> Program (compute-only or with communication)."""
    # Every line is a rank, an empty one included, as PyTorch's csv.reader sees it: a rank
    # with no work is written as an empty line and must survive the round trip.
    lines = text.splitlines()
    if not text.strip():
        raise _error(path, 1, 1, "empty CSV: no rank rows", help="one line per rank, comma-separated actions")
    cells_by_row = [line.split(",") if line else [] for line in lines]
    chosen = DIALECTS[dialect] if dialect else detect_dialect(c for row in cells_by_row for c in row)
    names = dict(chosen.read_names)
    if chosen is LegacyDialect:
        names["B"] = Kind.I  # provisional: resolve() decides per (stage, microbatch)

    def action(cell: str, line: int, col: int) -> Action:
        m = _CELL_RE.match(cell)
        kind = names.get(m.group(2)) if m else None
        if m is None or kind is None:
            raise _error(path, line, col, f"malformed action `{cell}` ({chosen.name} dialect)",
                         help="cells are [stage][kind][microbatch] such as `0F3`, empty for idle")
        if kind.stage_only == bool(m.group(3)):
            raise _error(path, line, col, f"`{cell}`: {kind.name} " + ("takes no microbatch" if kind.stage_only else "needs a microbatch"))
        return Action(int(m.group(1)), kind, int(m.group(3)) if m.group(3) else None)

    rows: list[list[Step]] = []
    segments: list[tuple[Segment, ...]] = []
    flat: list[Action] = []
    for line_no, cells in enumerate(cells_by_row, start=1):
        row: list[Step] = []
        segs: list[Segment] = []
        col = 1
        for raw in cells:
            cell = raw.strip()
            segs.append(Segment(len(row), line_no, col))
            if not cell:
                row.append(IDLE)
            elif cell.startswith("("):
                m = _OVERLAP_RE.match(cell)
                if m is None:
                    raise _error(path, line_no, col, f"malformed overlapped pair `{cell}`",
                                 help="write it as `(0F7;7B3)OVERLAP_F_B`")
                pair = (action(m.group(1).strip(), line_no, col), action(m.group(2).strip(), line_no, col))
                if not all(p.kind.is_compute for p in pair):
                    raise _error(path, line_no, col, f"`{cell}`: only compute actions (F, I, W, B) overlap")
                row.append(Overlap(pair))
                flat.extend(pair)
            else:
                a = action(cell, line_no, col)
                row.append(a)
                flat.append(a)
            col += len(raw) + 1
        rows.append(row)
        segments.append(tuple(segs))
    # Legacy B is decided over the whole file; rebuild the rows with the decision applied.
    resolved = dict(zip(map(id, flat), chosen.resolve(flat)))

    def fix(step: Step) -> Step:
        if type(step) is Action:
            return resolved[id(step)]
        if type(step) is Overlap:
            return Overlap(tuple(resolved[id(p)] for p in step.parts))
        return step

    final_rows = tuple(tuple(fix(s) for s in row) for row in rows)
    actions = [resolved[id(a)] for a in flat]
    if not actions:
        raise _error(path, 1, 1, "the CSV holds no actions")
    stages = max(a.stage for a in actions) + 1
    microbatches = max((a.microbatch for a in actions if a.microbatch is not None), default=0) + 1
    ranks = len(final_rows)
    seen, _ = infer(final_rows, stages)
    placement = tuple(min(seen[s]) if s in seen else s % ranks for s in range(stages))
    source = SourceMap(path, text, Span(1, 1), tuple(Span(i + 1, 1) for i in range(ranks)), tuple(segments),
                       format="csv")
    return Program(ranks=ranks, stages=stages, microbatches=microbatches, placement=placement,
                   rows=final_rows, source=source)


def write_csv(program: Program, dialect: str = "current") -> tuple[str, list[Diagnostic]]:
    """Program -> CSV text, plus warnings for what the format cannot express."""
    table = DIALECTS[dialect].write_names
    warnings: list[Diagnostic] = []
    path = program.source.path if program.source else "<program>"
    # Legacy `B` reads back as backward-input only when a `W` for it follows; a lone one
    # would come back as a full backward.
    lone_inputs: set[tuple[int, int | None]] = set()
    if DIALECTS[dialect] is LegacyDialect:
        all_actions = [a for _, _, a in program.actions()]
        weights = {(a.stage, a.microbatch) for a in all_actions if a.kind is Kind.W}
        lone_inputs = {(a.stage, a.microbatch) for a in all_actions if a.kind is Kind.I} - weights

    def token(a: Action) -> str:
        return f"{a.stage}{table[a.kind]}{'' if a.microbatch is None else a.microbatch}"

    lines = []
    for rank, row in enumerate(program.rows):
        cells: list[str] = []
        for index, step in enumerate(row):
            if type(step) is Idle:
                cells.append("")
            elif type(step) is Action:
                if step.kind is Kind.I and (step.stage, step.microbatch) in lone_inputs:
                    span = program.source.step_span(rank, index) if program.source else Span(1, 1)
                    warnings.append(Diagnostic(
                        "PPS031", f"`{step}` has no matching W: the legacy dialect will read it back as a full backward",
                        path, span.line, span.column, severity=Severity.WARNING, rank=rank, step=index))
                cells.append(token(step))
            elif type(step) is Overlap:
                cells.append("(" + ";".join(token(p) for p in step.parts) + ")OVERLAP_F_B")
            else:
                assert isinstance(step, Batch)
                span = program.source.step_span(rank, index) if program.source else Span(1, 1)
                warnings.append(Diagnostic(
                    "PPS031", f"PyTorch's CSV has no batches: `{step}` written as {plural(len(step.parts), 'separate cell')}",
                    path, span.line, span.column, severity=Severity.WARNING, rank=rank, step=index))
                cells.extend(token(p) for p in step.parts)
        lines.append(",".join(cells))
    return "\n".join(lines) + "\n", warnings
