"""`gather(table, keys)`: `table[k]` for every k in `keys`, as a list, in one C-level call.

The readers, the encoding and the printer look up every step of a row in a table (a token's
meaning, a code's prefix, an action's time). `operator.itemgetter(*keys)` does those lookups
inside one call, where `map(table.__getitem__, keys)` calls a method wrapper per key. A
missing key raises KeyError or IndexError as the table's own lookup does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from operator import itemgetter
from typing import TypeVar

Key = TypeVar("Key")
Value = TypeVar("Value")


def gather(table: Mapping[Key, Value] | Sequence[Value], keys: Iterable[Key]) -> list[Value]:
    """`[table[k] for k in keys]` (itemgetter of one key gives the value, not a tuple of it)."""
    if not isinstance(keys, (list, tuple)):
        keys = list(keys)
    if len(keys) > 1:
        return list(itemgetter(*keys)(table))
    return [table[k] for k in keys]  # type: ignore[index]
