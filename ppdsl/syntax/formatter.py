"""`ppdsl fmt`: rewrite a `.pps` file canonically, keeping what its author wrote.

Ranges, zips, generators, comments, line breaks inside rows and single blank lines all
survive; spacing, option order, bracket spelling and the PyTorch `OVERLAP_F_B` suffix are
normalised. The result parses to the same program and formatting it again changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from lark import Token, Tree

from .grammar import lark_parser
from .parser import HEADER_OPTIONS, read

_COMMENT_RE = re.compile(r"#[^\n]*")
_RANGE_RE = re.compile(r"\{\s*(\d+)\s*\.\.\s*(\d+)\s*\}")
_LEADING_ZERO_RE = re.compile(r"(?<!\d)0+(?=\d)")


def _digits(text: str) -> str:
    """`00F03` -> `0F3`: numbers without leading zeros (the search keeps the common case fast)."""
    return _LEADING_ZERO_RE.sub("", text) if _LEADING_ZERO_RE.search(text) else text


def _value_text(tree: Tree[Token]) -> str:
    if tree.data == "list_value":
        return "[" + ", ".join(_digits(str(c)) for c in tree.children) + "]"
    if tree.data == "int_value":
        return _digits(str(tree.children[0]))
    return str(tree.children[0])


def _options(node: Tree[Token], order: list[str] | None = None) -> list[str]:
    opts = [c for c in node.children if isinstance(c, Tree) and c.data == "option"]
    if order is not None:
        rank = {name: i for i, name in enumerate(order)}
        opts.sort(key=lambda o: rank.get(str(o.children[0]), len(rank)))
    return [f"{o.children[0]}={_value_text(o.children[1])}" for o in opts]  # type: ignore[arg-type]


def _item_text(item: Tree[Token] | Token) -> str:
    if isinstance(item, Tree):  # zip
        return "[" + " ".join(_item_text(c) for c in item.children) + "]"
    text = _digits(str(item))
    if item.type == "ACTIONS":
        return " ".join(text.split())
    if item.type == "RANGED":
        return _RANGE_RE.sub(lambda m: "{" + m.group(1) + ".." + m.group(2) + "}", text)
    if item.type == "OVERLAP":
        inner = text[1 : text.index(")")]
        return "(" + ";".join(_RANGE_RE.sub(lambda m: "{" + m.group(1) + ".." + m.group(2) + "}", p.strip())
                              for p in inner.split(";")) + ")"
    return "<" + " ".join(text[1:-1].split()) + ">"  # BATCH


def _line_of(item: Tree[Token] | Token) -> int:
    return item.meta.line if isinstance(item, Tree) else (item.line or 1)


def format_text(text: str, path: str = "<input>", steps_limit: int | None = None,
                validate: Callable[[str, str, int | None], object] = read) -> str:
    """The canonical form of `text`. Raises PpsError when `validate` refuses the text (within
    `steps_limit` steps); the default reads it but runs no `use` line, which
    `expansion.parse` does (`ppdsl fmt` passes it)."""
    validate(text, path, steps_limit)  # full validation first: never rewrite a file into something else
    if not text.endswith("\n"):
        text += "\n"
    tree = lark_parser().parse(text)
    content: dict[int, str] = {}
    indent_at: dict[int, int] = {}  # lines inside a row: comments there are indented like it
    for stmt in tree.children:
        assert isinstance(stmt, Tree)
        line = stmt.meta.line
        if stmt.data == "header":
            content[line] = " ".join(["pipeline", *_options(stmt, list(HEADER_OPTIONS))])
        elif stmt.data == "costs":
            content[line] = " ".join(["costs", *_options(stmt)])
        elif stmt.data == "use":
            content[line] = f"use {stmt.children[0]}(" + ", ".join(_options(stmt)) + ")"
        else:
            prefix = f"rank {stmt.children[0]}:"
            by_line: dict[int, list[str]] = {}
            for item in stmt.children[1:]:
                by_line.setdefault(_line_of(item), []).append(_item_text(item))
            indent = len(prefix) + 1
            lines = sorted(by_line)
            first_items = by_line.pop(line, [])
            content[line] = " ".join([prefix, *first_items]) if first_items else prefix
            for other in lines:
                if other != line:
                    content[other] = " " * indent + " ".join(by_line[other])
            last = max(lines, default=line)
            for inner in range(line + 1, last):
                indent_at[inner] = indent
    comments = {text.count("\n", 0, m.start()) + 1: m.group(0).rstrip() for m in _COMMENT_RE.finditer(text)}
    out: list[str] = []
    total = text.count("\n")
    for line in range(1, total + 1):
        body = content.get(line)
        comment = comments.get(line)
        if body is not None:
            out.append(body + ("  " + comment if comment else ""))
        elif comment is not None:
            out.append(" " * indent_at.get(line, 0) + comment)
        elif out and out[-1] != "":
            out.append("")
    while out and out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n"
