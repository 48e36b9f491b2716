"""`.pps` text -> `ir.Program`, with every problem as a located diagnostic.

The Lark tree only describes structure; this module walks it by hand (a handful of nodes per
row) and hands flat runs of tokens to `scan`. A row's line that is one plain run of canonical
tokens (what `ppdsl expand` writes) is read whole by `scan.PlainRuns` before Lark runs, and
Lark is given a one-character stand-in word there (`_Builder.set_aside_runs`): the tree, every
line and column and every diagnostic are those of the real text, and neither Lark's lexer nor
a Python step per token is spent on the run. Anything Lark refuses is parsed again from the
real text, so its errors are told exactly as before.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterator
from typing import Union, cast

from lark import Token, Tree
from lark.exceptions import LarkError, UnexpectedInput

from .. import placement as placement_mod
from attrs import evolve, field, frozen

from ..diagnostics import Diagnostic, PpsError, sorted_unique
from ..wording import did_you_mean, plural
from ..ir import IDLE, KIND_BY_NAME, Batch, LazyRows, Overlap, Program, RowCodes, Segment, SourceMap, Span, Step, steps_from_codes
from ..gcpause import no_gc
from ..limits import (DEFAULT_MAX_STEPS, MAX_ACTIONS, MAX_MEMORY, MAX_MICROBATCHES, MAX_RANKS, MAX_REPORTED_ERRORS,
                      MAX_STAGES, STEPS_PER_RANK, ranks_past, steps_help)
from . import scan
from .errors import lark_error_to_diagnostic, word_at
from .grammar import lark_parser

Value = Union[int, float, str, tuple[int, ...]]

HEADER_OPTIONS = {
    "ranks": "number of ranks (processes); required",
    "microbatches": "number of microbatches per step; required",
    "stages": "number of model stages (default: from the placement, the rows, or ranks)",
    "placement": "stage -> rank map: loop, v, or a list such as [0,1,1,0]",
    "memory": "limit on live activations per rank, in microbatches of a rank's activations (checked by `ppdsl lint`)",
    "mode": "train (default) or inference (forward only)",
}



@frozen
class UseLine:
    """A `use NAME(ARG=VALUE, ...)` line as written: what runs it (`ppdsl/expansion.py`) tells a
    generator's problem under the argument it names, else under the name."""

    name: str
    name_span: Span
    arguments: tuple[tuple[str, Value], ...]
    argument_spans: dict[str, Span]
    span: Span  # the whole line (`end_column` None when it goes on past its first line)


@frozen
class Unexpanded:
    """A file whose rows a `use` line makes, read up to that line: the header as checked (sizes
    within their bounds, a placement that fits them) and the line, for the expansion to run."""

    path: str
    text: str = field(repr=False)
    header: Span
    options: dict[str, Span]  # where the header writes each option
    ranks: int
    microbatches: int
    stages: int | None  # None: the generator's count
    placement: tuple[int, ...] | None  # the header's, when it gives one
    placement_name: str | None  # `placement=loop` or `=v`: a shape taken at the generator's count
    mode: str
    memory: float | None
    costs: tuple[tuple[str, float], ...]
    use: UseLine
    steps_limit: int
    # Errors noted while reading that did not stop it (a line Lark refused): told with the
    # expansion's own, or alone once it succeeds.
    found: tuple[Diagnostic, ...] = ()


class _Fail(Exception):
    """Stops reading the file, with the errors that stop it (none when they were noted already)."""

    def __init__(self, *diagnostics: Diagnostic):
        self.diagnostics = diagnostics


def _value(tree: Tree[Token]) -> Value:
    kind = tree.data
    if kind == "int_value":
        digits = str(tree.children[0]).lstrip("0") or "0"
        # Too long for int() (and for any limit): inf, which options() refuses as too large.
        return int(digits) if len(digits) <= 4000 else math.inf
    if kind == "float_value":
        return float(str(tree.children[0]))
    if kind == "name_value":
        return str(tree.children[0])
    return tuple(scan.number(str(c)) for c in tree.children)  # list_value


class _Builder:
    def __init__(self, text: str, path: str, steps_limit: int, whole_runs: bool = True):
        self.text = text
        self.whole_runs = whole_runs
        self.path = path
        self.steps_limit = steps_limit
        self.tokens: scan.TokenReader | None = None  # made by rows() for the header's bounds
        # The row being read, as the reader's integers, while every item of it is a plain run
        # read by `tokens` (None once one is not, and its steps are made): see ir.LazyRows.
        self.known: RowCodes | None = None
        self.runs = scan.PlainRuns(KIND_BY_NAME, " ", "_")
        # line -> (column, text, codes or None) of each row's first run, read before Lark: see set_aside.
        self.set_aside: dict[int, tuple[int, str, RowCodes | None]] = {}
        self.whole: str | None = None  # the text of the item just read, when `runs` read it whole
        # Errors that do not stop reading (a bad row, a bad token): the rest of the file is read
        # for more, so one run tells them all (up to MAX_REPORTED_ERRORS).
        self.found: list[Diagnostic] = []
        self.real_lines: list[str] | None = None  # the text's lines, once a stand-in is put back

    # -- diagnostics -----------------------------------------------------------------------
    def note(self, d: Diagnostic) -> None:
        """An error after which reading goes on; past MAX_REPORTED_ERRORS, reading stops."""
        self.found.append(d)
        if len(self.found) >= MAX_REPORTED_ERRORS:
            raise _Fail()

    def reported(self) -> list[Diagnostic]:
        found = sorted_unique(self.found)
        if len(self.found) >= MAX_REPORTED_ERRORS:
            stopped = f"ppdsl stopped reading {self.path} after {MAX_REPORTED_ERRORS:,} errors; fix these and run again"
            notes = [*found[-1].notes, stopped]
            found[-1] = evolve(found[-1], notes=notes)  # type: ignore[arg-type]  # attrs types converter=tuple badly
        return found

    def error(self, code: str, message: str, line: int, column: int, width: int = 1,
              help: str | None = None, rank: int | None = None) -> Diagnostic:
        return Diagnostic(code, message, self.path, line, column, column + width, help=help, rank=rank)

    def at_span(self, span: Span, code: str, message: str, help: str | None = None) -> Diagnostic:
        """Underline the whole of `span` (one column when its end is unknown)."""
        return self.error(code, message, span.line, span.column, (span.end_column or span.column + 1) - span.column, help)

    def at(self, node: Tree[Token] | Token, code: str, message: str, help: str | None = None,
           rank: int | None = None) -> Diagnostic:
        if isinstance(node, Token):
            line, col, width = node.line or 1, node.column or 1, len(node)
        else:
            line, col = node.meta.line, node.meta.column
            width = (node.meta.end_column - col) if node.meta.end_line == line else 1
        return self.error(code, message, line, col, width, help, rank)

    def too_many(self, node: Tree[Token] | Token, made: str, count: int, at_least: bool = False) -> _Fail:
        """PPS015 at `node`: the program makes `count` steps, past the limit; the help gives the
        `--max-steps` that takes them (or says that none does)."""
        return _Fail(self.at(node, "PPS015", f"{made} {'at least ' if at_least else ''}{count:,} steps, more than "
                                             f"the limit of {self.steps_limit:,}", help=steps_help(count)))

    def steps_in(self, item: Tree[Token] | Token, bounds: scan.Bounds) -> int:
        """The steps `item` makes, counted without making them (ScanError where it would fail)."""
        if isinstance(item, Tree):  # zip
            return sum(self.steps_in(tok, bounds) for tok in item.children)
        real = self.real(item)
        assert isinstance(real, Token)
        if real.type == "ACTIONS":
            return sum(scan.steps_in(word, bounds) for word in str(real).split())
        if real.type == "OVERLAP":
            return scan.steps_in(str(real)[1:].split(";")[0].strip(), bounds)
        return 1 if real.type == "BATCH" else scan.steps_in(str(real), bounds)

    def steps_after(self, rows: list[Tree[Token]], row: int, item: int, bounds: scan.Bounds) -> tuple[int, bool]:
        """The steps the items after `rows[row].children[item]` make, and whether some could not
        be counted (a malformed range: the parse stops at it, and the count is a lower bound)."""
        total, short = 0, False
        for r, tree in enumerate(rows[row:]):
            for child in tree.children[item + 1 if r == 0 else 1:]:
                try:
                    total += self.steps_in(child, bounds)
                except scan.ScanError:
                    short = True
        return total, short

    # -- statements ------------------------------------------------------------------------
    def options(self, node: Tree[Token], allowed: dict[str, str] | None, what: str) -> tuple[dict[str, Value], dict[str, Span]]:
        values: dict[str, Value] = {}
        spans: dict[str, Span] = {}
        unknown: list[Diagnostic] = []  # every misspelt option is told, not only the first
        for opt in node.children:
            if not isinstance(opt, Tree) or opt.data != "option":
                continue
            name_tok, value_tree = opt.children
            assert isinstance(name_tok, Token) and isinstance(value_tree, Tree)
            name = str(name_tok)
            if allowed is not None and name not in allowed:
                unknown.append(self.at(name_tok, "PPS012", f"unknown {what} option `{name}`",
                                       help=did_you_mean(name, allowed) + "valid options: " + ", ".join(allowed)))
                continue
            if name in values:
                raise _Fail(self.at(name_tok, "PPS011", f"{what} option `{name}` given twice"))
            value = _value(value_tree)
            if isinstance(value, (int, float)) and not abs(value) <= 1e300:
                raise _Fail(self.at(opt, "PPS012", f"{what} option `{name}` is too large to be a number",
                                    help="write an ordinary decimal number such as 1.5 or 2e3"))
            values[name] = value
            spans[name] = Span(opt.meta.line, opt.meta.column, opt.meta.end_column)
        if unknown:  # (what the misspelt options would have said, `ranks=` above all, is not asked for)
            raise _Fail(*unknown)
        return values, spans

    def int_option(self, values: dict[str, Value], spans: dict[str, Span], name: str, lo: int, hi: int) -> int | None:
        if name not in values:
            return None
        value = values[name]
        span = spans[name]
        if not isinstance(value, int) or isinstance(value, bool):
            raise _Fail(self.at_span(span, "PPS012", f"`{name}` must be a whole number, not `{value}`"))
        if not lo <= value <= hi:
            raise _Fail(self.at_span(span, "PPS015" if value > hi else "PPS012",
                                     f"`{name}={scan.shown(value)}` is outside {lo}..{hi}"))
        return value

    def set_aside_runs(self) -> str:
        """The text Lark is given: each `rank N: ...` line whose rest is one plain run that
        `runs` reads whole has that run replaced by a one-character word (Lark's lexer costs as
        much a token as reading it does here, and even a long word costs it ~10 ns a character).
        Such a run is exactly one ACTIONS token in the real text too, at the same place:
        canonical words with one blank between, after `:` and blanks, before blanks and the
        line's end. So the tree is the one the real text gives, with the same lines and columns
        (every node of a row ends on the next line, after its newline); only that token's text
        and length differ, and the builder takes both from `set_aside` (`real`). Rows that are
        not plain runs are left to Lark as they are."""
        text = self.text
        if not self.whole_runs:
            return text
        out: list[str] = []
        copied = counted = 0
        line = 1
        for head in _line_starts(text, "rank"):
            m = _ROW_HEAD_RE.match(text, head)
            if m is None:
                continue
            start = m.end()
            run = text[start:text.index("\n", start)].rstrip(" \t\r")
            if not run:
                continue
            line += text.count("\n", counted, start)
            counted = start
            codes = self.runs.read(run)
            self.set_aside[line] = (start - m.start() + 1, run, codes)
            if codes is not None:
                out.append(text[copied:start])
                out.append(_STAND_IN)
                copied = start + len(run)
        if not out:
            return text
        out.append(text[copied:])
        return "".join(out)

    def build(self) -> Program | Unexpanded:
        program: Program | Unexpanded | None = None
        try:
            tree = self.tree()
            if self.found and not any(isinstance(t, Tree) and t.data == "header" for t in tree.children):
                # The header was lost with a syntax error: nothing below can be read against it.
                raise _Fail()
            program = self.program(tree)
        except _Fail as fail:
            self.found.extend(fail.diagnostics)
        except LarkError as exc:  # pragma: no cover - Lark raises UnexpectedInput for bad text
            self.found.append(self.error("PPS002", str(exc), 1, 1))
        if isinstance(program, Unexpanded):  # its errors are told with the expansion's
            return evolve(program, found=tuple(sorted_unique(self.found)))
        if self.found or program is None:
            raise PpsError(self.reported()) from None
        return program

    def tree(self) -> Tree[Token]:
        lark_text = self.set_aside_runs()
        try:
            return lark_parser().parse(lark_text)
        except UnexpectedInput as exc:
            # A run set aside is one valid ACTIONS word where the real text has one, so Lark
            # refuses the same token of either text; the text with the stand-ins is read on
            # (the builder takes their runs from `set_aside`), and a line Lark refuses gets its
            # real text back first (`restored`).
            return self.recovered_tree(lark_text, exc)

    def recovered_tree(self, text: str, known: UnexpectedInput | None) -> Tree[Token]:
        """The tree of the real text without the statements (or the lines of a row) Lark
        refuses, each refusal noted. Lark stops at the first error, and everything before the
        statement it is in parses (an LALR parser sees an error at the first token no valid
        file could continue with): that part is kept, the statement is read alone (a row
        without its bad line, a row's first line without its items, else nothing), and what
        follows is parsed the same way, a window of statements at a time that doubles while
        it parses (so a file with an error on every row costs a few parses of each line, not
        one of the rest of the file per error). `known` is the error of the whole `text`, when
        Lark was given it already."""
        lines = text.split("\n")
        lines.pop()  # the text ends with "\n"
        starts = [i for i, line in enumerate(lines) if _STATEMENT_RE.match(line)]
        statements: list[Tree[Token] | Token] = []
        first, window = 0, len(lines)
        while first < len(lines):
            k = bisect.bisect_right(starts, first)
            stop = starts[k + window - 1] if k + window - 1 < len(starts) else len(lines)
            segment = "\n".join(lines[first:stop]) + "\n"
            if known is None:
                try:
                    statements.extend(_shifted(lark_parser().parse(segment), first).children)
                    first, window = stop, 2 * window
                    continue
                except UnexpectedInput as exc:
                    known = exc
            bad = first + lark_error_to_diagnostic(known, segment, self.path).line - 1
            known = None
            if self.restored(lines, bad):
                continue
            k = bisect.bisect_right(starts, bad)  # starts[k - 1] <= bad < starts[k]
            start = max(starts[k - 1], first) if k else first
            end = starts[k] if k < len(starts) else len(lines)
            if start > first:
                statements.extend(self.statement(lines, first, start))
            statements.extend(self.statement(lines, start, end))
            first, window = end, RECOVERY_WINDOW
        return Tree("start", statements)

    def restored(self, lines: list[str], index: int) -> bool:
        """Put back the real text of line `index` where Lark was given a stand-in for its run:
        what follows the run on its line (a stray `\\r`) stands at other columns there."""
        aside = self.set_aside.get(index + 1)
        if aside is None or aside[2] is None or index >= len(lines):
            return False
        del self.set_aside[index + 1]
        if self.real_lines is None:
            self.real_lines = self.text.split("\n")
        lines[index] = self.real_lines[index]
        return True

    def statement(self, lines: list[str], start: int, end: int) -> list[Tree[Token] | Token]:
        """What Lark accepts of lines[start:end] (one statement, with a row's lines), each
        refusal noted. In a row the refused word is left out (up to WORDS_LEFT_OUT times), or
        the line once a second error is on it (leaving a word out may break what is left of
        the line: that is no error of the file's); a refused header, `use` or `costs` line is
        left out whole."""
        chunk = lines[start:end]
        row = _ROW_HEAD_IN_LINE_RE.match(chunk[0])
        head_end = row.end() if row is not None else 0
        words_out: set[int] = set()  # the lines a word was left out of
        while True:
            text = "\n".join(chunk) + "\n"
            try:
                return list(_shifted(lark_parser().parse(text), start).children)
            except UnexpectedInput as exc:
                d = lark_error_to_diagnostic(exc, text, self.path)
            at = d.line - 1
            if self.restored(lines, start + at):
                chunk[at] = lines[start + at]
                continue
            self.set_aside.pop(start + d.line, None)  # the line is read as it is left, not as it was
            if row is None or at >= len(chunk):
                self.note(evolve(d, line=d.line + start))
                return []
            if at not in words_out:
                self.note(evolve(d, line=d.line + start))
                word, column = word_at(chunk[at], d.column)
                if word and (at > 0 or column - 1 >= head_end) and len(words_out) < WORDS_LEFT_OUT \
                        and len(text) <= WORD_BY_WORD_BYTES:
                    chunk[at] = chunk[at][: column - 1] + " " * len(word) + chunk[at][column - 1 + len(word):]
                    words_out.add(at)
                    continue
            if at == 0 and chunk[0][head_end:].strip():
                chunk[0] = chunk[0][:head_end]  # a row's first line: keep `rank N:`, leave out its items
            elif 0 < at and chunk[at].strip():
                chunk[at] = ""
            else:
                return []  # `rank N:` itself is malformed

    def program(self, tree: Tree[Token]) -> Program | Unexpanded:
        header: Tree[Token] | None = None
        costs: Tree[Token] | None = None
        use: Tree[Token] | None = None
        rows: list[Tree[Token]] = []
        for stmt in tree.children:
            assert isinstance(stmt, Tree)
            if stmt.data == "header":
                if header is not None:
                    raise _Fail(self.at(stmt, "PPS011", "a second `pipeline` header",
                                        help=f"the first is on line {header.meta.line}; keep one"))
                header = stmt
            elif header is None:
                raise _Fail(self.at(stmt, "PPS010", "a `pipeline` header must come before anything else",
                                    help="start the file with e.g. `pipeline ranks=4 microbatches=8`"))
            elif stmt.data == "costs":
                if costs is not None:
                    raise _Fail(self.at(stmt, "PPS011", "a second `costs` line"))
                costs = stmt
            elif stmt.data == "use":
                if use is not None or rows:
                    raise _Fail(self.at(stmt, "PPS017", "a `use` line cannot be combined with rank rows or another `use`",
                                        help="a file either spells out its rows or names one generator"))
                use = stmt
            else:
                if use is not None:
                    raise _Fail(self.at(stmt, "PPS017", "rank rows cannot follow a `use` line",
                                        help="a file either spells out its rows or names one generator"))
                rows.append(stmt)
        if header is None:  # no statement at all: any other statement before a header fails above
            what = "the file is empty" if not self.text.strip() else "the file holds only comments"
            raise _Fail(self.error("PPS010", f"no `pipeline` header: {what}", 1, 1,
                                   help="start the file with e.g. `pipeline ranks=4 microbatches=8`"))
        values, spans = self.options(header, HEADER_OPTIONS, "header")
        for required in ("ranks", "microbatches"):
            if required not in values:
                raise _Fail(self.at(header, "PPS012", f"the header needs `{required}=N`",
                                    help="e.g. `pipeline ranks=4 microbatches=8`"))
        ranks = self.int_option(values, spans, "ranks", 1, MAX_RANKS)
        microbatches = self.int_option(values, spans, "microbatches", 1, MAX_MICROBATCHES)
        stages = self.int_option(values, spans, "stages", 1, MAX_STAGES)
        assert ranks is not None and microbatches is not None
        too_many_ranks = ranks_past(ranks, self.steps_limit)
        if too_many_ranks is not None:
            raise _Fail(self.at_span(spans["ranks"], "PPS015", too_many_ranks,
                                     help=steps_help(STEPS_PER_RANK * ranks)))
        mode = values.get("mode", "train")
        if mode not in ("train", "inference"):
            raise _Fail(self.at_span(spans["mode"], "PPS012", f"`mode` is train or inference, not `{mode}`"))
        memory = values.get("memory")
        if memory is not None and (isinstance(memory, (str, tuple)) or not 0 < memory <= MAX_MEMORY):
            s = spans["memory"]
            raise _Fail(self.error("PPS012", f"`memory` must be a positive number up to {MAX_MEMORY:g}, not `{memory}`",
                                   s.line, s.column))
        explicit_placement = self.header_placement(values, spans, ranks, stages)
        if explicit_placement is not None and stages is None:
            stages = len(explicit_placement)
        cost_items: tuple[tuple[str, float], ...] = ()
        if costs is not None:
            cvalues, cspans = self.options(costs, None, "costs")
            for key, value in cvalues.items():
                if isinstance(value, (str, tuple)):
                    s = cspans[key]
                    raise _Fail(self.error("PPS012", f"cost `{key}` must be a number, not `{value}`", s.line, s.column))
            cost_items = tuple((k, float(v)) for k, v in cvalues.items())  # type: ignore[arg-type]

        header_span = Span(header.meta.line, header.meta.column, header.meta.end_column)
        if use is not None:
            named = values.get("placement")
            return Unexpanded(self.path, self.text, header_span, spans, ranks, microbatches, stages, explicit_placement,
                              named if isinstance(named, str) else None, str(mode),
                              float(memory) if memory is not None else None, cost_items, self.use_line(use),
                              self.steps_limit)
        built_rows, step_pos, row_spans = self.rows(rows, ranks, microbatches, stages)
        if self.found:  # the rows' errors are all noted: nothing is made of broken rows
            raise _Fail()
        final_placement, stages = self.resolve_placement(explicit_placement, built_rows, ranks, stages, spans)
        smap = SourceMap(self.path, self.text, header_span, row_spans, step_pos, spans)
        program = Program(
            ranks=ranks,
            stages=stages,
            microbatches=microbatches,
            placement=final_placement,
            rows=built_rows,
            mode=mode,  # type: ignore[arg-type]
            memory_limit=float(memory) if memory is not None else None,
            costs=cost_items,
            source=smap,
        )
        return program

    def use_line(self, use: Tree[Token]) -> UseLine:
        name = use.children[0]
        assert isinstance(name, Token)
        line, column = name.line or 1, name.column or 1
        args, arg_spans = self.options(use, None, "generator")
        meta = use.meta
        return UseLine(str(name), Span(line, column, column + len(name)), tuple(args.items()), arg_spans,
                       Span(meta.line, meta.column, meta.end_column if meta.end_line == meta.line else None))

    def header_placement(self, values: dict[str, Value], spans: dict[str, Span], ranks: int,
                         stages: int | None) -> tuple[int, ...] | None:
        if "placement" not in values:
            return None
        value = values["placement"]
        s = spans["placement"]
        if isinstance(value, tuple):
            bad = [r for r in value if r >= ranks]
            if not value or bad:
                raise _Fail(self.error("PPS012", f"placement {list(value)} names rank {bad[0] if bad else '?'} "
                                       f"but there {'is' if ranks == 1 else 'are'} {plural(ranks, 'rank')}" if value else "placement is empty",
                                       s.line, s.column, help="list one rank per stage, each below `ranks`"))
            if stages is not None and len(value) != stages:
                raise _Fail(self.error("PPS011", f"placement lists {plural(len(value), 'stage')} but the header says stages={stages}",
                                       s.line, s.column))
            return value
        if value not in placement_mod.NAMED:
            raise _Fail(self.error("PPS012", f"unknown placement `{value}`", s.line, s.column,
                                   help="use loop, v, or a list of ranks such as [0,1,1,0]"))
        count = stages if stages is not None else (2 * ranks if value == "v" else ranks)
        return placement_mod.NAMED[str(value)](ranks, count)

    def rows(self, rows: list[Tree[Token]], ranks: int, microbatches: int, stages: int | None
             ) -> tuple[tuple[tuple[Step, ...], ...], tuple[tuple[Segment, ...] | None, ...], tuple[Span | None, ...]]:
        # Without a stage count, any stage number is accepted and resolve_placement infers the count.
        bound_stages = stages if stages is not None else MAX_STAGES
        bounds = (bound_stages, microbatches)
        self.tokens = scan.TokenReader(KIND_BY_NAME, bound_stages, microbatches, "_", IDLE, track_ranks=False)
        built: list[list[Step] | None] = [None] * ranks
        read: list[RowCodes | None] = [None] * ranks
        positions: list[list[Segment] | None] = [None] * ranks
        spans: list[Span | None] = [None] * ranks
        texts: list[str | None] = [None] * ranks
        total = 0
        for row_index, row in enumerate(rows):
            rank_tok = row.children[0]
            assert isinstance(rank_tok, Token)
            rank = scan.number(str(rank_tok))
            if rank >= ranks:
                self.note(self.at(rank_tok, "PPS013", f"rank {scan.shown(rank)} out of range: the header says ranks={ranks}",
                                  help=f"rows are numbered 0..{ranks - 1}"))
                continue
            if built[rank] is not None or read[rank] is not None:
                first = spans[rank]
                self.note(self.at(rank_tok, "PPS013", f"rank {rank} has a second row",
                                  help=f"its first row is on line {first.line if first else '?'}; "
                                       "a row may continue on the following lines instead"))
                continue
            steps: list[Step] = []
            pos: list[Segment] = []
            self.known = ([], [])
            for item_index, item in enumerate(row.children[1:], 1):
                self.item(item, bounds, steps, pos)
                # Checked per item, not per row: one row of ranges can ask for any number of
                # steps. Past the limit the rest is counted, not made, for the exact count.
                so_far = total + len(steps) + (len(self.known[0]) if self.known else 0)
                if so_far > self.steps_limit:
                    rest, short = self.steps_after(rows, row_index, item_index, bounds)
                    raise self.too_many(self.real(item), "the rows make", so_far + rest, short)
            if self.known is not None:  # plain runs only: kept as integers, no steps made
                total += len(self.known[0])
                read[rank] = self.known
                if len(row.children) == 2:  # one run, read whole: its text is what is printed
                    texts[rank] = self.whole
            else:
                total += len(steps)
                built[rank] = steps
            positions[rank] = pos
            spans[rank] = Span(row.meta.line, row.meta.column)
        made = [tuple(s) if s is not None else None if read[rank] is not None else () for rank, s in enumerate(built)]
        rows_out = cast("tuple[tuple[Step, ...], ...]", LazyRows(made, read, texts))
        pos_out = tuple(tuple(p) if p is not None else None for p in positions)
        return rows_out, pos_out, tuple(spans)

    def real(self, item: Tree[Token] | Token) -> Tree[Token] | Token:
        """The token as the real text has it, where Lark was given a stand-in (set_aside_runs)."""
        if isinstance(item, Token) and item.type == "ACTIONS":
            aside = self.set_aside.get(item.line or 0)
            if aside is not None and aside[0] == item.column and aside[2] is not None:
                return Token.new_borrow_pos("ACTIONS", aside[1], item)
        return item

    def item(self, item: Tree[Token] | Token, bounds: scan.Bounds, steps: list[Step], pos: list[Segment]) -> None:
        if isinstance(item, Tree):  # zip
            self.make_steps(steps)
            self.zip(item, bounds, steps, pos)
            return
        line, col = item.line or 1, item.column or 1
        try:
            if item.type == "ACTIONS":
                if "\n" in item:  # pragma: no cover - the terminal cannot span lines
                    raise AssertionError
                aside = self.set_aside.get(line)
                if aside is not None and aside[0] == col and (aside[2] is not None or len(aside[1]) == len(item)):
                    text, whole = aside[1], aside[2]  # the run read before Lark (set aside, or not read whole)
                else:
                    text = str(item)
                    whole = self.runs.read(text) if self.whole_runs else None
                fast = self.tokens.within(whole, self.runs) if whole is not None and self.tokens is not None else None
                self.whole = text if fast is not None else None
                if fast is None and self.tokens is not None:
                    fast = self.tokens.codes(text.split())
                if fast is None:  # something to report: token by token, every bad one told
                    self.make_steps(steps)
                    pos.append(Segment(len(steps), line, col, text))
                    for err in scan.locate_run(text, bounds, steps, IDLE, MAX_REPORTED_ERRORS):  # type: ignore[arg-type]
                        self.note(self.error(err.code, err.message, line, col + err.offset, err.width, err.help))
                elif self.known is None:  # the row already has steps: these join them
                    pos.append(Segment(len(steps), line, col, text))
                    steps.extend(steps_from_codes(fast, IDLE))  # type: ignore[arg-type]
                else:
                    pos.append(Segment(len(self.known[0]), line, col, text))
                    if self.known[0]:
                        self.known[0].extend(fast[0])
                        self.known[1].extend(fast[1])
                    else:  # the row's first run: its lists are the reader's fresh ones
                        self.known = fast
                return
            self.make_steps(steps)  # a range, an overlapped pair or a batch: the row is made of steps
            if item.type == "RANGED":
                pos.append(Segment(len(steps), line, col))
                steps.extend(scan.expand_ranged(str(item), 0, bounds))
            elif item.type == "OVERLAP":
                pos.append(Segment(len(steps), line, col))
                steps.extend(self.overlap(str(item), bounds))
            else:  # BATCH
                pos.append(Segment(len(steps), line, col))
                steps.append(self.batch(str(item), bounds))
        except scan.ScanError as err:
            self.note(self.error(err.code, err.message, line, col + err.offset, err.width, err.help))

    def make_steps(self, steps: list[Step]) -> None:
        """From here on the row is built as steps: the plain runs read before become steps."""
        if self.known is not None:
            steps.extend(steps_from_codes(self.known, IDLE))  # type: ignore[arg-type]
            self.known = None

    def overlap(self, text: str, bounds: scan.Bounds) -> list[Overlap]:
        inner_end = text.index(")")
        inner = text[1:inner_end]
        parts = inner.split(";")
        if len(parts) != 2 or not all(p.strip() for p in parts):
            raise scan.ScanError("PPS007", f"an overlapped pair holds exactly two actions: `{text}`", 0, len(text),
                                 help="write it as `(0F7;7B3)`: a forward and a backward of two stages")
        offset = 1
        expanded = []
        for part in parts:
            stripped = part.strip()
            lead = len(part) - len(part.lstrip())
            actions = scan.expand_word(stripped, offset + lead, bounds)
            for a in actions:
                if not a.kind.is_compute:
                    raise scan.ScanError("PPS007", f"`{a}` in an overlapped pair is not a compute action",
                                         offset + lead, len(stripped), help="only F, B, I and W overlap")
            expanded.append((stripped, offset + lead, actions))
            offset += len(part) + 1
        scan.zip_lengths(expanded)
        return [Overlap((a, b)) for a, b in zip(expanded[0][2], expanded[1][2])]

    def batch(self, text: str, bounds: scan.Bounds) -> Batch:
        words = scan.split_words(text[1:-1])
        if not words:
            raise scan.ScanError("PPS008", "an empty batch `<>`", 0, len(text),
                                 help="a batch holds one or more SEND_*/RECV_* actions, e.g. `<0SEND_F3 0RECV_B0>`")
        parts = []
        for word, offset in words:
            if "{" in word:
                raise scan.ScanError("PPS008", f"ranges are not allowed inside a batch: `{word}`", offset + 1, len(word))
            action = scan.parse_word(word, offset + 1, bounds)
            if not action.kind.is_comm:
                raise scan.ScanError("PPS008", f"`{word}` in a batch is not a send or receive", offset + 1, len(word),
                                     help="only SEND_F, RECV_F, SEND_B and RECV_B can be fused into a batch")
            parts.append(action)
        return Batch(tuple(parts))

    def zip(self, node: Tree[Token], bounds: scan.Bounds, steps: list[Step], pos: list[Segment]) -> None:
        members: list[tuple[str, int, list[Step]]] = []
        member_pos: list[tuple[int, int]] = []  # (line, column) of each zipped member
        line = node.meta.line
        for tok in node.children:
            assert isinstance(tok, Token)
            col = tok.column or 1
            try:
                if tok.type == "ACTIONS":
                    for word, offset in scan.split_words(str(tok)):
                        members.append((word, col + offset, [IDLE] if word == "_" else list(scan.expand_word(word, 0, bounds))))
                        member_pos.append((line, col + offset))
                elif tok.type == "RANGED":
                    members.append((str(tok), col, list(scan.expand_ranged(str(tok), 0, bounds))))
                    member_pos.append((line, col))
                else:
                    members.append((str(tok), col, list(self.overlap(str(tok), bounds))))
                    member_pos.append((line, col))
            except scan.ScanError as err:
                self.note(self.error(err.code, err.message, tok.line or line, col + err.offset, err.width, err.help))
                return
            if sum(len(items) for _, _, items in members) > self.steps_limit:
                raise self.too_many(tok, "the zip makes", self.steps_in(node, bounds))
        try:
            scan.zip_lengths(members)
        except scan.ScanError as err:
            self.note(self.error(err.code, err.message, line, members[0][1], 1, err.help))
            return
        for i in range(len(members[0][2])):
            for (_, _, items), p in zip(members, member_pos):
                pos.append(Segment(len(steps), p[0], p[1]))
                steps.append(items[i])

    def resolve_placement(self, explicit: tuple[int, ...] | None, rows: tuple[tuple[Step, ...], ...], ranks: int,
                          stages: int | None, spans: dict[str, Span]) -> tuple[tuple[int, ...], int]:
        """The stage -> rank map and the stage count, inferred from the rows where the header gives neither."""
        if explicit is not None:
            # header_placement made it one rank per stage (and set the count when the header had none).
            return explicit, len(explicit)
        seen = placement_mod.stage_ranks(rows)
        if stages is None:
            stages = max(seen) + 1 if seen else ranks
        missing = [s for s in range(stages) if s not in seen]
        if missing and seen:
            # Without `placement=`, a stage's rank is the row its actions are on; a stage with
            # no actions anywhere has none. (A file with no actions at all is left on `loop`.)
            s = spans.get("stages") or spans["ranks"]
            listed = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
            raise _Fail(self.at_span(s, "PPS016", f"stage{'s' if len(missing) > 1 else ''} {listed} appear{'' if len(missing) > 1 else 's'} "
                                     f"in no row, so {'their ranks are' if len(missing) > 1 else 'its rank is'} unknown",
                                     help="give every stage an action in some row, or say `placement=loop`, `placement=v` or list the ranks"))
        # A stage found on several rows is left on its first rank; the checker reports the rest.
        return tuple(min(seen[s]) if s in seen else s % ranks for s in range(stages)), stages


# The start of a row's line (as `rank INT ":"` lexes; other spellings are left to Lark), and
# what a run set aside is replaced with: one ACTIONS word.
_ROW_HEAD_RE = re.compile(r"rank[ \t]+[0-9]+[ \t]*:[ \t]*")
_ROW_HEAD_IN_LINE_RE = re.compile(r"[ \t]*rank[ \t]+[0-9]+[ \t]*:")
# Statements parsed together after an error, at first (the window doubles while they parse).
RECOVERY_WINDOW = 16
# Words of one row left out, one by one, to read on past syntax errors (each costs a parse of
# the row); past them, or in a row of more than WORD_BY_WORD_BYTES, a line with an error is
# left out whole.
WORDS_LEFT_OUT = 50
WORD_BY_WORD_BYTES = 1 << 16
# A line that starts a statement (every other line of a file goes on a row, or is blank).
_STATEMENT_RE = re.compile(r"[ \t]*(?:pipeline|rank|use|costs)(?![A-Za-z0-9_])")


def _shifted(tree: Tree[Token], lines: int) -> Tree[Token]:
    """`tree` of a text that starts `lines` lines into the file, its positions made the file's."""
    if lines:
        for sub in tree.iter_subtrees():
            if not sub.meta.empty:
                sub.meta.line += lines
                sub.meta.end_line += lines
            for tok in sub.children:
                if isinstance(tok, Token) and tok.line is not None:
                    tok.line += lines
                    if tok.end_line is not None:
                        tok.end_line += lines
    return tree
_STAND_IN = "_"


def _line_starts(text: str, word: str) -> Iterator[int]:
    """Where the lines that start with `word` start (str.find: a regex `^` tries every character)."""
    if text.startswith(word):
        yield 0
    at = text.find("\n" + word)
    while at >= 0:
        yield at + 1
        at = text.find("\n" + word, at + 1)


def read(text: str, path: str = "<input>", steps_limit: int | None = None, whole_runs: bool = True
         ) -> Program | Unexpanded:
    """Read `.pps` text: the program its rows spell out, or the file up to its `use` line (which
    `expansion.expand` runs; `expansion.parse` does both). Raises `PpsError` with located
    diagnostics on any problem.

    The program may have at most `steps_limit` steps (default `limits.DEFAULT_MAX_STEPS`; at most
    `limits.MAX_ACTIONS`). `whole_runs=False` reads every run through Lark and word by word, never
    whole (`scan.PlainRuns`): the same program and the same diagnostics, slower; the tests
    compare the two."""
    # Editors on Windows may start a file with a byte-order mark; columns count from after it.
    text = text.removeprefix("\ufeff")
    if not text.endswith("\n"):
        text += "\n"
    limit = min(DEFAULT_MAX_STEPS if steps_limit is None else steps_limit, MAX_ACTIONS)
    builder = _Builder(text, path, limit, whole_runs)
    # Hundreds of thousands of small immutable objects: generational GC would rescan them all
    # several times over for nothing.
    with no_gc():
        return builder.build()
