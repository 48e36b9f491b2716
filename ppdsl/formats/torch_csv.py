"""PyTorch's schedule CSV (`torch.distributed.pipelining` `_load_csv` / `_dump_csv`).

One row per rank, one comma-separated cell per step, an empty cell for an idle step. Stage
placement is not written: it follows from which row holds a stage.

Two dialects, told apart by their tables only:
- current: `I` is backward-input, `B` a full backward;
- legacy: `B` is backward-input when a `W` for the same stage and microbatch follows, and
  `BW` is a full backward.

Reading is built for files of a million cells. A row of canonical cells and empty ones (what
`_dump_csv` writes) is read whole by the parser's `syntax.scan.PlainRuns` (a few C-level string
passes over the row and two dictionary lookups a cell); any other row is split at its commas
and read by `syntax.scan.TokenReader` (C-level string methods over the row and dictionary
lookups per cell); both parse and bound each distinct prefix and number by `limits.py` once,
into integers, stage-kind and microbatch per cell (`ir.RowCodes`), which the encoding and the printers
read as they are: a row's Action objects are made only when a pass asks for its steps
(`ir.LazyRows`). A row that does not fit that shape (blanks around cells, overlapped pairs,
anything malformed) is read again cell by cell, which is also where every error is located.
No number sizes anything before it is checked: stage and microbatch numbers against the limits
when first seen, the count of rows and cells before a row is split, and the stage x microbatch
space against the file's cells.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from typing import ClassVar, cast

from ..diagnostics import Diagnostic, PpsError, Severity
from ..encoding import encode, read_rows
from ..wording import plural
from ..ir import (IDLE, Action, Batch, Idle, Kind, LazyRows, Overlap, Program, RowCodes, Segment,
                  SourceMap, Span, Step, actions_of, make_action, steps_from_codes)
from ..gcpause import no_gc
from ..kinds import TABLE
from ..limits import MAX_ACTIONS, MAX_MICROBATCHES, MAX_RANKS, MAX_REPORTED_ERRORS, MAX_STAGES
from ..syntax.printer import ActionText
from ..syntax.scan import PlainRuns, TokenReader, number, shown

_CELL_RE = re.compile(r"(\d+)([A-Z_]+)(\d*)\Z")
_OVERLAP_RE = re.compile(r"\(([^;()]*);([^;()]*)\)(?:OVERLAP_F_B)?\Z")
_PAIR_END = ")OVERLAP_F_B"  # how PyTorch ends a pair's cell
# A backward or weight cell anywhere in the text (inside a pair too): what dialect detection reads.
_BACKWARD_RE = re.compile(r"(?<!\w)(\d+)(BW|B|W)(\d+)(?!\w)")
# A file this small may name stage x microbatch pairs it does not cover (the checker then says
# which are missing); past it, the pairs are bounded by the cells, each needing a forward.
SMALL_SHAPE = 65_536


def _spellings(dialect: str) -> dict[Kind, str]:
    """Each kind's spelling in one dialect: its row's `csv` in the table of kinds (`ppdsl/kinds.py`),
    for the kinds PyTorch's CSV has (`in_csv`)."""
    return {k: k.row.csv[dialect] for k in Kind if k.row.in_csv}


class CurrentDialect:
    name: ClassVar[str] = "current"
    # Kind written in the file -> Kind in the IR, and back.
    write_names: ClassVar[dict[Kind, str]] = _spellings("current")
    read_names: ClassVar[dict[str, Kind]] = {text: k for k, text in write_names.items()}


class LegacyDialect(CurrentDialect):
    name = "legacy"
    # `B` reads as `I`, provisionally: `_resolve_legacy` decides per (stage, microbatch).
    write_names = _spellings("legacy")
    read_names = {text: k for k, text in write_names.items()}


DIALECTS: dict[str, type[CurrentDialect]] = {"current": CurrentDialect, "legacy": LegacyDialect}


def detect_dialect_text(text: str) -> type[CurrentDialect]:
    """Legacy when a cell says `BW`, or a `B` has a matching `W`; current otherwise."""
    if "W" not in text:  # the common case, decided by one C-level search
        return CurrentDialect
    backward: set[tuple[str, str]] = set()
    weight: set[tuple[str, str]] = set()
    for stage, kind, mb in _BACKWARD_RE.findall(text):
        if kind == "BW":
            return LegacyDialect
        key = (stage.lstrip("0") or "0", mb.lstrip("0") or "0")
        (backward if kind == "B" else weight).add(key)
    return LegacyDialect if backward & weight else CurrentDialect


def detect_dialect(cells: Iterable[str]) -> type[CurrentDialect]:
    """`detect_dialect_text` over separate cells."""
    return detect_dialect_text(",".join(cells))


class _Located(Exception):
    """A problem at a column of the line being read (the reader adds path and line)."""

    def __init__(self, code: str, column: int, message: str, help: str | None = None):
        super().__init__(message)
        self.code, self.column, self.message, self.help = code, column, message, help


class _Reader:
    """One file's read: plain rows through a `TokenReader`, the rest cell by cell."""

    def __init__(self, dialect: type[CurrentDialect], whole_runs: bool = True):
        self.dialect = dialect
        self.whole_runs = whole_runs
        self.names = dict(dialect.read_names)  # legacy `B` as `I`, provisionally: _resolve_legacy() decides
        self.tokens = TokenReader(self.names, MAX_STAGES, MAX_MICROBATCHES, "", IDLE)
        self.runs = PlainRuns(self.names, ",", "")

    def fast_row(self, rank: int, line: str) -> RowCodes | None:
        """A row of plain cells as the reader's integers (`ir.RowCodes`: no Action object), or
        None when the row needs the careful path. A row of canonical actions and empty cells is
        read whole (`PlainRuns`), any other cell by cell through the reader's tables."""
        whole = self.runs.read(line) if self.whole_runs else None
        if whole is not None:
            return self.tokens.within(whole, self.runs, rank)  # (the runs' bounds are the reader's: never None)
        return self.tokens.codes(line.split(","), rank)

    def paired_row(self, rank: int, line: str) -> list[Step] | None:
        """A row of plain cells and overlapped pairs written as PyTorch writes them
        (`(0F1;1B0)OVERLAP_F_B`, DualPipeV's), as steps: the plain cells read whole in one run,
        the pairs' halves in another, with no cell parsed alone; None when some cell is
        written otherwise, out of bounds or not a compute action in a pair (the careful path
        then says which). Positions need nothing of this: a CSV step is its cell."""
        if not self.whole_runs:
            return None
        read = self.runs.read_pairs(line.split(","), _PAIR_END)
        if read is None:
            return None
        paired, plain, halves = read
        plain_in, halves_in = self.tokens.within(plain, self.runs, rank), self.tokens.within(halves, self.runs, rank)
        if plain_in is None or halves_in is None:
            return None
        made = cast("Iterator[Step]", iter(steps_from_codes(plain_in, IDLE)))
        halves_made = cast("Iterator[Action]", iter(steps_from_codes(halves_in, IDLE)))
        return [Overlap((next(halves_made), next(halves_made))) if p else next(made) for p in paired]

    # -- the careful path: one cell at a time, every problem located ------------------------
    def action(self, cell: str, column: int) -> Action:
        m = _CELL_RE.match(cell)
        kind = self.names.get(m.group(2)) if m else None
        if m is None or kind is None:
            raise _Located("PPS030", column, f"malformed action `{_short(cell)}` ({self.dialect.name} dialect)",
                           help="cells are [stage][kind][microbatch] such as `0F3`, empty for idle")
        if kind.stage_only == bool(m.group(3)):
            raise _Located("PPS030", column, f"`{_short(cell)}`: {kind.name} " +
                           ("takes no microbatch" if kind.stage_only else "needs a microbatch"))
        stage = number(m.group(1))
        if stage >= MAX_STAGES:
            raise _Located("PPS014", column, f"stage {shown(stage)} in `{_short(cell)}` is over the limit: "
                           f"stages are 0..{MAX_STAGES - 1:,}", help="a typo? stages are numbered from 0")
        micro = number(m.group(3)) if m.group(3) else None
        if micro is not None and micro >= MAX_MICROBATCHES:
            raise _Located("PPS014", column, f"microbatch {shown(micro)} in `{_short(cell)}` is over the limit: "
                           f"microbatches are 0..{MAX_MICROBATCHES - 1:,}", help="a typo? microbatches are numbered from 0")
        return make_action(stage, kind, micro)

    def careful_row(self, rank: int, line: str) -> list[Step]:
        row: list[Step] = []
        column = 1
        for raw in line.split(","):
            cell = raw.strip()
            at = column + len(raw) - len(raw.lstrip())
            if not cell:
                row.append(IDLE)
            elif cell.startswith("("):
                m = _OVERLAP_RE.match(cell)
                if m is None:
                    raise _Located("PPS030", at, f"malformed overlapped pair `{_short(cell)}`",
                                   help="write it as `(0F7;7B3)OVERLAP_F_B`")
                pair = (self.action(m.group(1).strip(), at), self.action(m.group(2).strip(), at))
                if not all(p.kind.is_compute for p in pair):
                    raise _Located("PPS030", at, f"`{cell}`: only compute actions (F, I, W, B) overlap")
                row.append(Overlap(pair))
            else:
                row.append(self.action(cell, at))
            column += len(raw) + 1
        tokens = self.tokens
        for step in row:
            for a in actions_of(step):
                tokens.stage_ranks.setdefault(a.stage, rank)
                if a.microbatch is not None and a.microbatch > tokens.max_micro:
                    tokens.max_micro = a.microbatch
        return row


def _short(cell: str) -> str:
    return cell if len(cell) <= 40 else cell[:37] + "..."


def _error(path: str, line: int, column: int, message: str, help: str | None = None, code: str = "PPS030") -> PpsError:
    return PpsError([Diagnostic(code, message, path, line, column, help=help)])


def _resolve_legacy(rows: list[list[Step]]) -> list[tuple[Step, ...] | None]:
    """Legacy `B` was read as the placeholder Kind.I: it is backward-input exactly when a `W`
    for its stage and microbatch exists, and a full backward otherwise."""
    flat = [a for row in rows for step in row for a in actions_of(step)]
    with_w = {(a.stage, a.microbatch) for a in flat if a.kind is Kind.W}

    def fix(a: Action) -> Action:
        return a if a.kind is not Kind.I or (a.stage, a.microbatch) in with_w else make_action(a.stage, Kind.B, a.microbatch)

    for row in rows:
        for i, step in enumerate(row):
            if type(step) is Action:
                row[i] = fix(step)
            elif type(step) is Overlap:
                row[i] = Overlap((fix(step.parts[0]), fix(step.parts[1])))
    return [tuple(row) for row in rows]


def read_csv(text: str, path: str = "<input>", dialect: str | None = None, whole_runs: bool = True) -> Program:
    """A PyTorch schedule CSV -> Program (compute-only or with communication).
    `whole_runs=False` reads no row whole (`PlainRuns`), only cell by cell: the same program."""
    with no_gc():
        return _read(text, path, dialect, whole_runs)


def _read(text: str, path: str, dialect: str | None, whole_runs: bool) -> Program:
    # Every line is a rank, an empty one included, as PyTorch's csv.reader sees it: a rank
    # with no work is written as an empty line and must survive the round trip.
    if not text.strip():
        raise _error(path, 1, 1, "empty CSV: no rank rows", help="one line per rank, comma-separated actions")
    # Lines end at `\n` (an `\r` before it dropped), as the parser and the excerpts count them.
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    if "\r" in text:
        lines = [line.removesuffix("\r") for line in lines]
    if len(lines) > MAX_RANKS:
        raise _error(path, MAX_RANKS + 1, 1, f"more than {MAX_RANKS:,} rows: a CSV has one row per rank",
                     code="PPS015")
    chosen = DIALECTS[dialect] if dialect else detect_dialect_text(text)
    reader = _Reader(chosen, whole_runs)
    made: list[tuple[Step, ...] | None] = []  # the rows read cell by cell (None: kept as integers)
    read: list[RowCodes | None] = []  # the rows read whole, as the reader's integers
    cells = 0
    bad: list[Diagnostic] = []  # a bad cell ends its row only: every row's first is told
    for line_no, line in enumerate(lines, start=1):
        cells += line.count(",") + 1
        if cells > MAX_ACTIONS:  # counted before the row is split: the split would size a list by it
            raise _error(path, line_no, 1, f"more than {MAX_ACTIONS:,} cells in one file", code="PPS015",
                         help="split the schedule, or describe it with a generator")
        codes = reader.fast_row(line_no - 1, line) if line else None
        read.append(codes)
        if codes is not None:
            made.append(None)
        elif not line:
            made.append(())
        else:
            try:
                paired = reader.paired_row(line_no - 1, line) if "(" in line else None
                made.append(tuple(paired if paired is not None else reader.careful_row(line_no - 1, line)))
            except _Located as err:
                bad.extend(_error(path, line_no, err.column, err.message, err.help, err.code).diagnostics)
                if len(bad) >= MAX_REPORTED_ERRORS:
                    break
                made.append(())
    if bad:
        raise PpsError(bad)
    rows = LazyRows(made, read)
    if chosen is LegacyDialect:  # a legacy `B` is decided only now, from the actions
        rows = LazyRows(_resolve_legacy([list(row) for row in rows]), [None] * len(made))
    source = SourceMap(path, text, Span(1, 1), tuple(Span(i + 1, 1) for i in range(len(rows))),
                       tuple((Segment(0, i + 1, 1, line, delimiter=","),) if line else () for i, line in enumerate(lines)),
                       format="csv")
    stages, microbatches, placement = _shape(reader, rows, cells, source, path)
    return Program(ranks=len(rows), stages=stages, microbatches=microbatches, placement=placement,
                   rows=rows, source=source)


def _shape(reader: _Reader, rows: LazyRows, cells: int, source: SourceMap, path: str) -> tuple[int, int, tuple[int, ...]]:
    """Stage count, microbatch count and placement, as the cells imply them, each bounded."""
    ranks_of, max_micro = reader.tokens.stage_ranks, reader.tokens.max_micro
    if not ranks_of:
        raise _error(path, 1, 1, "the CSV holds no actions")
    stages = max(ranks_of) + 1
    microbatches = max(max_micro + 1, 1)  # a file of stage-only actions (`0UNSHARD`) names no microbatch
    if len(ranks_of) < stages:
        missing = list(islice((s for s in range(stages) if s not in ranks_of), 8))
        listed = ", ".join(map(str, missing)) + (", ..." if stages - len(ranks_of) > len(missing) else "")
        span = _first_span(rows, source, lambda a: a.stage == stages - 1)
        raise _error(path, span.line, span.column, f"stage {stages - 1} makes {stages:,} stages, but stage{'s' * (len(missing) > 1)} "
                     f"{listed} appear{'s' * (len(missing) == 1)} in no row, so {'their ranks are' if len(missing) > 1 else 'its rank is'} unknown",
                     help="a CSV gives a stage's rank by the row it is on: number the stages 0, 1, ... without gaps",
                     code="PPS016")
    if stages * microbatches > max(cells, SMALL_SHAPE):
        span = _first_span(rows, source, lambda a: a.microbatch == max_micro)
        raise _error(path, span.line, span.column, f"microbatch {max_micro} makes {plural(stages, 'stage')} x {microbatches:,} "
                     f"microbatches, more than the file's {cells:,} cells can cover (each needs a forward)",
                     help="a typo? microbatches are numbered from 0", code="PPS015")
    return stages, microbatches, tuple(ranks_of[s] for s in range(stages))


def _first_span(rows: LazyRows, source: SourceMap, wanted: Callable[[Action], bool]) -> Span:
    rank, index, _ = _first_located(rows, wanted)
    return source.step_span(rank, index)


def _first_located(rows: Sequence[Sequence[Step]], wanted: Callable[[Action], bool]) -> tuple[int, int, Action]:
    """(rank, step, action) of the first action `wanted` holds of."""
    for rank, row in enumerate(rows):
        for index, step in enumerate(row):
            for a in actions_of(step):
                if wanted(a):
                    return rank, index, a
    raise ValueError("no such action")  # pragma: no cover - only called for a kind the program has


def write_csv(program: Program, dialect: str = "current") -> tuple[str, list[Diagnostic]]:
    """Program -> CSV text, plus warnings for what the format cannot express (PpsError, PPS031,
    for an action it has no kind for)."""
    names = DIALECTS[dialect].write_names
    path = program.source.path if program.source else "<program>"
    if any(k in TABLE.by_value and Kind(k) not in names for k in encode(program).kinds):
        at = _first_located(program.rows, lambda a: a.kind not in names)
        span = program.source.step_span(*at[:2]) if program.source else Span(1, 1)
        raise PpsError([Diagnostic("PPS031", f"PyTorch's CSV has no `{at[2].kind.name}` action: `{at[2]}` cannot be "
                                   "written",
                                   path, span.line, span.column, rank=at[0], step=at[1],
                                   help=f"keep the schedule as .pps; PyTorch's CSV has {', '.join(names.values())}")])
    text_of = ActionText.for_program(program, names)
    warnings: list[Diagnostic] = []
    # Legacy `B` reads back as backward-input only when a `W` for it follows; a lone one
    # would come back as a full backward.
    lone_inputs: set[tuple[int, int | None]] = set()
    if DIALECTS[dialect] is LegacyDialect:
        all_actions = [a for _, _, a in program.actions()]
        weights = {(a.stage, a.microbatch) for a in all_actions if a.kind is Kind.W}
        lone_inputs = {(a.stage, a.microbatch) for a in all_actions if a.kind is Kind.I} - weights

    def warn(rank: int, index: int, message: str) -> None:
        span = program.source.step_span(rank, index) if program.source else Span(1, 1)
        warnings.append(Diagnostic("PPS031", message, path, span.line, span.column, severity=Severity.WARNING,
                                   rank=rank, step=index))

    lines = []
    known = read_rows(program) or [None] * len(program.rows)
    for rank in range(len(program.rows)):
        as_read = known[rank]
        if as_read is not None and not lone_inputs:  # as its reader kept it: no Action object is made
            lines.append(text_of.read_row(as_read, "", ","))
            continue
        row = program.rows[rank]

        def other(step: Step, index: int) -> str:
            if type(step) is Idle:
                return ""
            if type(step) is Overlap:
                return "(" + ";".join(map(text_of.action, step.parts)) + ")OVERLAP_F_B"
            assert isinstance(step, Batch)
            warn(rank, index, f"PyTorch's CSV has no batches: `{step}` written as {plural(len(step.parts), 'separate cell')}")
            return ",".join(map(text_of.action, step.parts))

        if lone_inputs:
            for index, step in enumerate(row):
                if type(step) is Action and step.kind is Kind.I and (step.stage, step.microbatch) in lone_inputs:
                    warn(rank, index, f"`{step}` has no matching W: the legacy dialect will read it back as a full backward")
        lines.append(",".join(text_of.steps(row, other)))
    warnings.sort(key=lambda d: (d.rank, d.step))
    return "\n".join(lines) + "\n", warnings
