"""Counts in messages agree with their nouns: `1 step`, `2 steps`, `1 time unit`."""

from __future__ import annotations


def plural(count: float, noun: str, shown: str | None = None) -> str:
    """`count` and `noun`, with an `s` unless the count is exactly 1. `shown` is the count as
    the caller prints it (e.g. `1,024` or `0.5`); by default the number as it is."""
    number = shown if shown is not None else (f"{count:,}" if isinstance(count, int) else f"{count:g}")
    return f"{number} {noun}{'' if count == 1 else 's'}"
