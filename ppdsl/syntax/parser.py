"""`.pps` text -> `ir.Program`, with every problem as a located diagnostic.

The Lark tree only describes structure; the reader walks it by hand (a handful of nodes per
row), in three parts: the header, its `costs` line and a `use` line's arguments
(`syntax/header.py`), the rows (`syntax/rows.py`, which hands flat runs of tokens to `scan`),
and the hand-off of a `use` line to the expansion (`syntax/handoff.py`). This module reads
the statements in order and recovers past the lines Lark refuses. A row's line that is one
plain run of canonical tokens is read whole before Lark runs, and Lark is given a
one-character stand-in word there (`rows.RowReader.set_aside_runs`): the tree, every line and
column and every diagnostic are those of the real text. Anything Lark refuses is parsed again
from the real text, so its errors are told exactly as before.
"""

from __future__ import annotations

import bisect
import re

from lark import Token, Tree
from lark.exceptions import LarkError, UnexpectedInput

from attrs import evolve

from ..diagnostics import PpsError, sorted_unique
from ..ir import Program, SourceMap
from ..gcpause import no_gc
from ..limits import DEFAULT_MAX_STEPS, MAX_ACTIONS
from .errors import lark_error_to_diagnostic, word_at
from .grammar import lark_parser
from .handoff import Unexpanded as Unexpanded, UseLine as UseLine, Value as Value
from .header import HEADER_OPTIONS as HEADER_OPTIONS, HeaderReader
from .reporting import Fail
from .rows import PairedRowRefused, RowReader


class _Builder(RowReader, HeaderReader):
    """The whole file: its statements in order, the header (`HeaderReader`), then the rows
    (`RowReader`) or the `use` line handed to the expansion (`Unexpanded`), and the recovery
    that reads on past a line Lark refuses."""

    def build(self) -> Program | Unexpanded:
        program: Program | Unexpanded | None = None
        try:
            tree = self.tree()
            if self.found and not any(isinstance(t, Tree) and t.data == "header" for t in tree.children):
                # The header was lost with a syntax error: nothing below can be read against it.
                raise Fail()
            program = self.program(tree)
        except Fail as fail:
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
        if aside is None or (aside[2] is None and index + 1 not in self.paired) or index >= len(lines):
            return False
        del self.set_aside[index + 1]
        self.paired.pop(index + 1, None)
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
                    raise Fail(self.at(stmt, "PPS011", "a second `pipeline` header",
                                        help=f"the first is on line {header.meta.line}; keep one"))
                header = stmt
            elif header is None:
                raise Fail(self.at(stmt, "PPS010", "a `pipeline` header must come before anything else",
                                    help="start the file with e.g. `pipeline ranks=4 microbatches=8`"))
            elif stmt.data == "costs":
                if costs is not None:
                    raise Fail(self.at(stmt, "PPS011", "a second `costs` line"))
                costs = stmt
            elif stmt.data == "use":
                if use is not None or rows:
                    raise Fail(self.at(stmt, "PPS017", "a `use` line cannot be combined with rank rows or another `use`",
                                        help="a file either spells out its rows or names one generator"))
                use = stmt
            else:
                if use is not None:
                    raise Fail(self.at(stmt, "PPS017", "rank rows cannot follow a `use` line",
                                        help="a file either spells out its rows or names one generator"))
                rows.append(stmt)
        if header is None:  # no statement at all: any other statement before a header fails above
            what = "the file is empty" if not self.text.strip() else "the file holds only comments"
            raise Fail(self.error("PPS010", f"no `pipeline` header: {what}", 1, 1,
                                   help="start the file with e.g. `pipeline ranks=4 microbatches=8`"))
        h = self.read_header(header, costs)
        if use is not None:
            named = h.values.get("placement")
            return Unexpanded(self.path, self.text, h.span, h.spans, h.ranks, h.microbatches, h.stages, h.placement,
                              named if isinstance(named, str) else None, h.mode, h.memory, h.costs, self.use_line(use),
                              self.steps_limit, costs_line=h.costs_line, cost_spans=h.cost_spans,
                              limit_words=self.limit_words)
        built_rows, step_pos, row_spans = self.rows(rows, h.ranks, h.microbatches, h.stages)
        if self.found:  # the rows' errors are all noted: nothing is made of broken rows
            raise Fail()
        final_placement, stages = self.resolve_placement(h.placement, built_rows, h.ranks, h.stages, h.spans)
        smap = SourceMap(self.path, self.text, h.span, row_spans, step_pos, h.spans, costs_line=h.costs_line,
                         cost_spans=h.cost_spans)
        return Program(
            ranks=h.ranks,
            stages=stages,
            microbatches=h.microbatches,
            placement=final_placement,
            rows=built_rows,
            mode=h.mode,  # type: ignore[arg-type]
            memory_limit=h.memory,
            costs=h.costs,
            source=smap,
        )


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


def read(text: str, path: str = "<input>", steps_limit: int | None = None, whole_runs: bool = True
         ) -> Program | Unexpanded:
    """Read `.pps` text: the program its rows spell out, or the file up to its `use` line (which
    `expansion.expand` runs; `expansion.parse` does both). Raises `PpsError` with located
    diagnostics on any problem.

    The program may have at most `steps_limit` steps (default `limits.DEFAULT_MAX_STEPS`) beyond
    one for every `limits.WRITTEN_STEP_BYTES` of the text, which a file written out action by
    action always has; at most `limits.MAX_ACTIONS`. `whole_runs=False` reads every run through Lark and word by word, never
    whole (`scan.PlainRuns`): the same program and the same diagnostics, slower; the tests
    compare the two."""
    # Editors on Windows may start a file with a byte-order mark; columns count from after it.
    text = text.removeprefix("\ufeff")
    if not text.endswith("\n"):
        text += "\n"
    limit = min(DEFAULT_MAX_STEPS if steps_limit is None else steps_limit, MAX_ACTIONS)
    # Hundreds of thousands of small immutable objects: generational GC would rescan them all
    # several times over for nothing.
    with no_gc():
        try:
            return _Builder(text, path, limit, whole_runs).build()
        except PairedRowRefused:  # a row read as plain words and pairs has something to tell
            return _Builder(text, path, limit, whole_runs, paired_rows=False).build()
