"""Finding and loading the Lark grammar, once per process.

Building the LALR tables from the grammar takes a few hundred milliseconds, more than parsing
a large file's structure; Lark keeps the built tables in a cache file (its own `cache=`
option, keyed by the grammar, the options and the Lark and Python versions), so every `ppdsl`
command after the first starts without that cost. The file lives in the user's cache
directory, not the shared temporary one Lark picks by default: it is unpickled on load.
"""

from __future__ import annotations

import functools
import hashlib
import os
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


def cache_file(text: str, strict: bool) -> str | bool:
    """Where the built tables are kept, or False (no cache) where there is nowhere to keep them."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = os.path.join(base, "ppdsl")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    except OSError:
        return False
    if not os.access(folder, os.W_OK):
        return False
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return os.path.join(folder, f"pps-{digest}{'-strict' if strict else ''}.lark-cache")


@functools.lru_cache(maxsize=None)
def lark_parser(strict: bool = False) -> Lark:
    # No transformer here: positions (meta) are only reliable when transforming a finished tree.
    text = grammar_text()
    return Lark(
        text,
        cache=cache_file(text, strict),
        parser="lalr",
        lexer="contextual",
        propagate_positions=True,
        maybe_placeholders=False,
        strict=strict,
    )
