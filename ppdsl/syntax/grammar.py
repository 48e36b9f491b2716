"""Finding and loading the Lark grammar, once per process."""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

from lark import Lark

GRAMMAR_NAME = "pps.lark"


def grammar_text() -> str:
    """The grammar shipped in the wheel (ppdsl/grammars), else the source tree's grammars/."""
    shipped = resources.files("ppdsl").joinpath("grammars").joinpath(GRAMMAR_NAME)
    if shipped.is_file():
        return shipped.read_text(encoding="utf-8")
    in_tree = Path(__file__).resolve().parents[2] / "grammars" / GRAMMAR_NAME
    return in_tree.read_text(encoding="utf-8")


@functools.lru_cache(maxsize=None)
def lark_parser(strict: bool = False) -> Lark:
    # No transformer here: positions (meta) are only reliable when transforming a finished tree.
    return Lark(
        grammar_text(),
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        maybe_placeholders=False,
        strict=strict,
    )
