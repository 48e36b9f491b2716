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
# What a file may ask for: a 40-byte `use` line or a range `{0..999999}` asks for steps that
# cost no bytes, and every command costs 10-40 us a step (`show --svg` the most), so a small
# file stays under a few seconds in any command only if its steps are bounded too. A file
# gets MAX_EXPANDED_ACTIONS steps, or one per BYTES_PER_STEP of its bytes if that is more: a
# program written out one token a step (as `ppdsl expand` and `convert` write it, at least
# 4 bytes a step) always reads back, up to MAX_ACTIONS.
MAX_EXPANDED_ACTIONS: Final = 65_536
BYTES_PER_STEP: Final = 2

# Durations, latencies and the rest of a cost model, in the user's unit. Below MIN_COST a
# nonzero cost is a typo (or a subnormal float that turns a ratio of costs into infinity);
# above MAX_COST it is not a time. Between them every sum the simulator forms over
# MAX_ACTIONS steps stays a finite float.
MIN_COST: Final = 1e-9
MAX_COST: Final = 1e12
# `bytes` and `bandwidth` are counts, not times: a wider range, same rule for tiny values.
MAX_QUANTITY: Final = 1e18
# `memory` (live activations per rank) in a header or --max-memory: only compared, never
# sized by, so the bound only keeps it a finite, printable number.
MAX_MEMORY: Final = 1e30
# `show` in a terminal: --width, and the cells drawn in all (ranks x columns; or 4 per step of
# a larger schedule). Past it a cell stands for more time, so the picture stays this size at
# any ratio of costs.
MAX_WIDTH: Final = 100_000
MAX_PICTURE_CELLS: Final = 1_000_000
# `run`: training steps and seconds.
MAX_STEPS: Final = 10_000_000
MAX_SECONDS: Final = 1e7
# The checker and the engine size arrays by stages x microbatches: a program may declare at
# most this many (stage, microbatch) pairs, or four per action it has, whichever is more.
MAX_SPARSE_SLOTS: Final = 1 << 16
# `ppdsl search` prices thousands of candidate orders; past this many actions one candidate
# takes seconds and a search hours (16 ranks x 64 microbatches in a V is 6,144).
MAX_SEARCH_ACTIONS: Final = 100_000
# Errors told of one file: reading goes on past an error to tell the others, up to this many
# (then it stops, and says so); `lint` shows 50 of them unless asked for more.
MAX_REPORTED_ERRORS: Final = 1_000


def max_steps(file_bytes: int) -> int:
    """The steps a file of `file_bytes` may ask for (see MAX_EXPANDED_ACTIONS)."""
    return min(MAX_ACTIONS, max(MAX_EXPANDED_ACTIONS, file_bytes // BYTES_PER_STEP))
