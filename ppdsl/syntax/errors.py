"""Lark's exceptions -> PPS0xx diagnostics a person can act on."""

from __future__ import annotations

import difflib
import re

from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from ..diagnostics import Diagnostic

READABLE = {
    "ACTIONS": "an action such as `0F3`",
    "RANGED": "a ranged action such as `0F{0..3}`",
    "OVERLAP": "an overlapped pair such as `(0F7;7B3)`",
    "BATCH": "a batch such as `<0SEND_F3 0RECV_B0>`",
    "NAME": "a name",
    "INT": "a whole number",
    "FLOAT": "a number",
    "_NL": "the end of the line",
    "$END": "the end of the file",
    "LSQB": "`[`",
    "RSQB": "`]`",
    "LPAR": "`(`",
    "RPAR": "`)`",
    "COLON": "`:`",
    "EQUAL": "`=`",
    "COMMA": "`,`",
    "PIPELINE": "`pipeline`",
    "RANK": "`rank`",
    "USE": "`use`",
    "COSTS": "`costs`",
}

OPENERS = {"[": "]", "{": "}", "(": ")", "<": ">"}
CLOSERS = {v: k for k, v in OPENERS.items()}


def _expected(names: set[str] | frozenset[str]) -> str:
    shown = sorted({READABLE.get(n, n) for n in names})
    if len(shown) > 6:
        shown = shown[:6] + ["..."]
    return ", ".join(shown)


def _unbalanced(word: str) -> str | None:
    stack: list[str] = []
    for ch in word:
        if ch in OPENERS:
            stack.append(ch)
        elif ch in CLOSERS:
            if not stack or stack[-1] != CLOSERS[ch]:
                return ch
            stack.pop()
    return stack[-1] if stack else None


KEYWORDS = ("pipeline", "rank", "use", "costs")
STEP_TOKENS = {"ACTIONS", "RANGED", "OVERLAP", "BATCH", "LSQB"}


def _misspelt_keyword(word: str) -> str | None:
    close = difflib.get_close_matches(word.lower(), KEYWORDS, n=1, cutoff=0.6)
    return close[0] if close and word.isalpha() else None


def _empty_group(line_text: str, column: int) -> bool:
    """Is the closer at `column` the first thing after its opener (`[]`, `[ ]`)?"""
    before = line_text[: column - 1].rstrip()
    return before.endswith(("[", "(", "<"))


def word_at(line_text: str, column: int) -> tuple[str, int]:
    """The blank-delimited word around a 1-based column, with its start column."""
    start = min(max(column - 1, 0), len(line_text))
    while start > 0 and not line_text[start - 1].isspace():
        start -= 1
    m = re.match(r"\S*", line_text[start:])
    return (m.group(0) if m else ""), start + 1


def _option_mistake(exc: UnexpectedToken, line_text: str, column: int, path: str, line: int) -> Diagnostic | None:
    """`use 1f1b(virtual)` (no `=`) and `use vpp(virtual=2,)` (a comma with nothing after it)."""
    before = line_text[: column - 1].rstrip()
    if set(exc.expected) == {"EQUAL"}:
        name = re.search(r"[A-Za-z][A-Za-z0-9_]*$", before)
        key = name.group(0) if name else "virtual"
        glued = re.search(r"=([0-9][0-9.]*[A-Za-z_][A-Za-z0-9_.]*)$", before)
        if glued:  # `memory=0x10`, `ranks=4k`: a number with letters in it, read as a number and a name
            start = len(before) - len(glued.group(1)) + 1
            return Diagnostic("PPS002", f"`{glued.group(1)}` is not a number", path, line, start,
                              start + len(glued.group(1)), help="write the value as a plain decimal number")
        return Diagnostic("PPS002", f"expected `=` after `{key}`", path, line, column,
                          column + max(len(str(exc.token).strip()), 1), help=f"options are NAME=VALUE, e.g. `{key}=2`")
    bare = re.fullmatch(r"\s*use\s+([A-Za-z0-9_]+)", before)
    if bare and exc.token.type in ("_NL", "$END"):  # `use 1f1b`: a generator is called, even with no options
        return Diagnostic("PPS002", f"`use {bare.group(1)}` needs its parentheses", path, line, column,
                          help=f"write `use {bare.group(1)}()`, with any options inside")
    if before.endswith(",") and exc.token.type in ("RPAR", "_NL", "COMMA") and "NAME" in exc.expected:
        comma = len(before)
        return Diagnostic("PPS002", "a trailing comma" if exc.token.type == "RPAR" else "a comma with no option after it",
                          path, line, comma, comma + 1, help="delete the `,`: commas only separate options, "
                          "as in `vpp(virtual=2, chunks=1)`")
    return None


def lark_error_to_diagnostic(exc: UnexpectedInput, text: str, path: str) -> Diagnostic:
    line = getattr(exc, "line", None) or 1
    column = getattr(exc, "column", None) or 1
    # Lark counts lines by "\n" only; str.splitlines() also breaks at "\r", "\x0c", "\x1c"...
    lines = text.split("\n")
    if lines and not lines[-1]:
        lines.pop()
    if isinstance(exc, UnexpectedEOF) or line < 1:
        line = max(len(lines), 1)
        column = len(lines[-1]) + 1 if lines else 1
        return Diagnostic("PPS002", "unexpected end of file", path, line, column,
                          help=f"expected {_expected(set(getattr(exc, 'expected', ())))}")
    line_text = lines[line - 1] if line <= len(lines) else ""
    if isinstance(exc, UnexpectedCharacters):
        word, word_col = word_at(line_text, column)
        if exc.char in "])>" and _empty_group(line_text, column):
            return Diagnostic("PPS002", f"an empty group `{line_text[: column - 1].rstrip()[-1]}{exc.char}`", path,
                              line, column, column + 1, help="a zip `[...]` holds one or more actions; delete the brackets")
        bracket = _unbalanced(word)
        if bracket is not None:
            return Diagnostic("PPS006", f"unbalanced `{bracket}` in `{word}`", path, line, word_col,
                              word_col + len(word),
                              help="every `[`, `{`, `(` and `<` closes on the same line")
        char = exc.char
        if char == "-":
            return Diagnostic("PPS001", "unexpected `-`: numbers in a schedule are never negative", path, line, column,
                              column + 1, help="stages, microbatches, ranks and costs count from 0")
        if char.isalpha() and line_text[: column - 1].lstrip().startswith("rank"):
            keyword = _misspelt_keyword(word)
            return Diagnostic("PPS003", f"malformed action token `{word}`", path, line, word_col, word_col + len(word),
                              help=f"did you mean `{keyword}`? a line that does not start with a keyword continues the row above"
                              if keyword and word_col == 1 else
                              "an action is [stage][kind][microbatch] starting with the stage number, e.g. `0F3`")
        if char.isalpha() and word_col == 1 and _misspelt_keyword(word):
            return Diagnostic("PPS002", f"unknown statement `{word}`", path, line, word_col, word_col + len(word),
                              help=f"did you mean `{_misspelt_keyword(word)}`? lines start with pipeline, rank, use or costs")
        shown = repr(char) if not char.isprintable() or char.isspace() else f"`{char}`"
        allowed = getattr(exc, "allowed", None) or set()
        return Diagnostic("PPS001", f"unexpected character {shown}", path, line, column, column + 1,
                          help=f"expected {_expected(allowed)}" if allowed else None)
    assert isinstance(exc, UnexpectedToken)
    token = exc.token
    word, word_col = word_at(line_text, column)
    if str(token) in ("]", ")", ">") and _empty_group(line_text, column):
        return Diagnostic("PPS002", f"an empty group `{line_text[: column - 1].rstrip()[-1]}{token}`", path,
                          line, column, column + 1, help="a zip `[...]` holds one or more actions; delete the brackets")
    option = _option_mistake(exc, line_text, column, path, line)
    if option is not None:
        return option
    bracket = _unbalanced(word)
    if bracket is not None:
        return Diagnostic("PPS006", f"unbalanced `{bracket}` in `{word}`", path, line, word_col, word_col + len(word),
                          help="every `[`, `{`, `(` and `<` closes on the same line")
    if "ACTIONS" in exc.expected and token.type in ("NAME", "GENERATOR", "INT", "FLOAT"):
        keyword = _misspelt_keyword(word)
        return Diagnostic("PPS003", f"malformed action token `{word}`", path, line, word_col, word_col + len(word),
                          help=f"did you mean `{keyword}`? a line that does not start with a keyword continues the row above"
                          if keyword and word_col == 1 else
                          "an action is [stage][kind][microbatch] starting with the stage number, e.g. `0F3`")
    if token.type in STEP_TOKENS and "RANK" in exc.expected and "ACTIONS" not in exc.expected:
        return Diagnostic("PPS002", "actions outside a row", path, line, column, column + max(len(str(token)), 1),
                          help="a row starts with `rank N:`; only lines after a row continue it")
    if token.type in ("NAME", "GENERATOR") and "RANK" in exc.expected and _misspelt_keyword(str(token)):
        return Diagnostic("PPS002", f"unknown statement `{token}`", path, line, column, column + len(str(token)),
                          help=f"did you mean `{_misspelt_keyword(str(token))}`? lines start with pipeline, rank, use or costs")
    if token.type in ("RSQB", "RPAR") and "RSQB" not in exc.expected and "RPAR" not in exc.expected:
        return Diagnostic("PPS006", f"unbalanced `{token}`", path, line, column, column + 1,
                          help="remove it or add the opening bracket")
    if token.type == "_NL" and ("RSQB" in exc.expected or "RPAR" in exc.expected):
        closer = "]" if "RSQB" in exc.expected else ")"
        return Diagnostic("PPS006", f"unclosed bracket: expected `{closer}` before the end of the line", path,
                          line, column, column + 1, help="groups close on the line they open")
    if token.type == "$END":
        return Diagnostic("PPS002", "unexpected end of file", path, line, column,
                          help=f"expected {_expected(exc.expected)}")
    shown = "end of the line" if token.type == "_NL" else f"`{token}`"
    return Diagnostic("PPS002", f"unexpected {shown}", path, line, column, column + max(len(str(token).strip()), 1),
                      help=f"expected {_expected(exc.expected)}")
