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
# The steps (an overlapped pair is one) a command takes from one file unless its `--max-steps`
# says more: a 40-byte `use` line or a range `{0..999999}` asks for steps that cost no bytes,
# so a file is bounded by what a command does with its steps in a few seconds, whatever its
# size. Measured on one core (benchmarks/RESULTS.md): a million steps of a 128-rank pipeline
# take lint 1.8 s, simulate 4.2 s, convert 3.2 s, and twice that in a pipeline of 65,536
# stages; `show` draws 15-35 us a step; a command that lowers the program first (`expand
# --comms`, `simulate` with measured messages, `run`) adds two steps a step and costs 5 us a step.
DEFAULT_MAX_STEPS: Final = 500_000
# What a file writes out costs it bytes: `0F0` and a separator are 4. A file may hold one step
# for every WRITTEN_STEP_BYTES of its bytes beyond its command's limit, so a file written out
# action by action is read whatever its size (its cost is linear in bytes the user already has),
# and the limit bounds only what a few bytes make (a `use` line, a range, a zip).
WRITTEN_STEP_BYTES: Final = 4
DEFAULT_MAX_PICTURE_STEPS: Final = 1 << 18
DEFAULT_MAX_LOWERED_STEPS: Final = 1 << 18
# A rank costs the commands about as much as this many steps whatever it holds (its tables,
# its lane, its report line): 65,536 ranks of 4 steps each simulate in 4.7 s of CPU, as a
# million steps on 128 ranks do. A program of R ranks counts as at least R times this.
STEPS_PER_RANK: Final = 16


def file_limit(limit: int, size: int) -> tuple[int, str]:
    """The steps a file of `size` characters may hold under a command's `limit`, and the words
    that say so in an error: the limit, and what the file's own bytes can write out."""
    written = size // WRITTEN_STEP_BYTES
    steps = min(limit + written, MAX_ACTIONS)
    if steps == MAX_ACTIONS or not written:
        return steps, f"the limit of {steps:,}"
    return steps, f"the limit of {limit:,} beyond the {written:,} its {size:,} bytes can write out"


def ranks_past(ranks: int, limit: int, limit_words: str | None = None) -> str | None:
    """What to say when `ranks` alone count as more steps than `limit` (None when they do not);
    `limit_words` says the limit (`file_limit`'s words), by default its number."""
    if STEPS_PER_RANK * ranks <= limit:
        return None
    return (f"{ranks:,} ranks count as {STEPS_PER_RANK * ranks:,} steps ({STEPS_PER_RANK} a rank: each has its "
            f"tables, lane and lines), more than {limit_words or f'the limit of {limit:,}'}")


def steps_help(count: int) -> str:
    """What to do about a file of `count` steps past its command's limit."""
    if count > MAX_ACTIONS:
        return f"no command takes more than {MAX_ACTIONS:,} steps: use fewer ranks, microbatches or virtual stages"
    return (f"`--max-steps {count}` takes them (every command that reads a file has it; in Python "
            f"`steps_limit={count}`): the default keeps a command to a few seconds (docs/language.md#limits)")

# Durations, latencies and the rest of a cost model, in the user's unit. Below MIN_COST a
# nonzero cost is a typo (or a subnormal float that turns a ratio of costs into infinity);
# above MAX_COST it is not a time. Between them every sum the simulator forms over
# MAX_ACTIONS steps stays a finite float.
MIN_COST: Final = 1e-9
MAX_COST: Final = 1e12
# `bytes` and `bandwidth` are counts, not times: a wider range, same rule for tiny values.
MAX_QUANTITY: Final = 1e18
# `memory` (live activations per rank, `ppdsl.memory.UNIT`) in a header or --max-memory: only compared, never
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
# `use search(...)` in a file runs every time the file is read (lint, show, each rank of a
# run), with no progress shown: up to this many ranks x microbatches, about 10 s on a 2-core
# machine (16 x 32: 8.5 s); past it `ppdsl search -o` writes the schedule out once.
MAX_FILE_SEARCH_PAIRS: Final = 512
# Errors told of one file: reading goes on past an error to tell the others, up to this many
# (then it stops, and says so); `lint` shows 50 of them unless asked for more.
MAX_REPORTED_ERRORS: Final = 1_000

