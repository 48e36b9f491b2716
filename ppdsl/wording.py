"""Words in messages: counts agree with their nouns (`1 step`, `2 steps`, `8 microbatches`),
and a misspelt name is answered with the closest one (`did you mean `ranks`?`)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def plural(count: float, noun: str, shown: str | None = None) -> str:
    """`count` and `noun`, with an `s` unless the count is exactly 1. `shown` is the count as
    the caller prints it (e.g. `1,024` or `0.5`); by default the number as it is."""
    number = shown if shown is not None else (f"{count:,}" if isinstance(count, int) else f"{count:g}")
    if count == 1:
        return f"{number} {noun}"
    return f"{number} {noun}{'es' if noun.endswith(('s', 'x', 'z', 'ch', 'sh')) else 's'}"


def closest(word: str, choices: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The choice `word` is most likely a misspelling of, case aside (`FThenB` is `fthenb`), or None."""
    by_lower = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(word.lower(), list(by_lower), n=1, cutoff=cutoff)
    return by_lower[close[0]] if close else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`did you mean `x`? ` (to lead a help text), or "" when nothing is close."""
    match = closest(word, choices)
    return f"did you mean `{match}`? " if match is not None else ""
