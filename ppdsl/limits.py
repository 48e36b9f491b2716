"""The sizes ppdsl accepts from any input, in one place.

Every number read from a file, a CSV cell, a generator argument, a cost string, a profile or a
flag is checked against these before anything is sized by it: past them a schedule is a typo or
an attack, not a pipeline, and the answer is a located error instead of an allocation.
`docs/language.md` ("Limits") lists them for users.
"""

from __future__ import annotations

from typing import Final

MAX_RANKS: Final = 65_536
MAX_STAGES: Final = 1_048_576
MAX_MICROBATCHES: Final = 1_048_576
# ~64 bytes of memory per action: 20M actions is over a gigabyte already.
MAX_ACTIONS: Final = 20_000_000
MAX_FILE_BYTES: Final = 512 * 1024 * 1024
# `ppdsl search` prices thousands of candidate orders; past this many actions one candidate
# takes seconds and a search hours (16 ranks x 64 microbatches in a V is 6,144).
MAX_SEARCH_ACTIONS: Final = 100_000
