"""Counts in messages agree with their nouns: `1 step`, `2 steps`, `8 microbatches`."""

from __future__ import annotations


def plural(count: float, noun: str, shown: str | None = None) -> str:
    """`count` and `noun`, with an `s` unless the count is exactly 1. `shown` is the count as
    the caller prints it (e.g. `1,024` or `0.5`); by default the number as it is."""
    number = shown if shown is not None else (f"{count:,}" if isinstance(count, int) else f"{count:g}")
    if count == 1:
        return f"{number} {noun}"
    return f"{number} {noun}{'es' if noun.endswith(('s', 'x', 'z', 'ch', 'sh')) else 's'}"
