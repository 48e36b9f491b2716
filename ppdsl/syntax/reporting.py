"""The reader's diagnostics: where a problem is (a Lark node or token, a span) and whether
reading goes on after it (`Reporter.note`) or stops (`Fail`)."""

from __future__ import annotations

from attrs import evolve
from lark import Token, Tree

from ..diagnostics import Diagnostic, sorted_unique
from ..ir import Span
from ..limits import MAX_REPORTED_ERRORS, file_limit, steps_help


class Fail(Exception):
    """Stops reading the file, with the errors that stop it (none when they were noted already)."""

    def __init__(self, *diagnostics: Diagnostic):
        self.diagnostics = diagnostics


class Reporter:
    """The file being read and the errors found in it so far."""

    def __init__(self, text: str, path: str, steps_limit: int):
        self.text = text
        self.path = path
        # What the file may make under the command's limit: that limit beyond what its own
        # bytes can write out (`limits.file_limit`), and the words an error says it in.
        self.steps_limit, self.limit_words = file_limit(steps_limit, len(text))
        # Errors that do not stop reading (a bad row, a bad token): the rest of the file is read
        # for more, so one run tells them all (up to MAX_REPORTED_ERRORS).
        self.found: list[Diagnostic] = []

    def note(self, d: Diagnostic) -> None:
        """An error after which reading goes on; past MAX_REPORTED_ERRORS, reading stops."""
        self.found.append(d)
        if len(self.found) >= MAX_REPORTED_ERRORS:
            raise Fail()

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

    def too_many(self, node: Tree[Token] | Token, made: str, count: int, at_least: bool = False) -> Fail:
        """PPS015 at `node`: the program makes `count` steps, past the limit; the help gives the
        `--max-steps` that takes them (or says that none does)."""
        return Fail(self.at(node, "PPS015", f"{made} {'at least ' if at_least else ''}{count:,} steps, more than "
                                             f"{self.limit_words}", help=steps_help(count)))
