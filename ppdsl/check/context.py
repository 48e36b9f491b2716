"""What every rule sees: the program, its integer encoding, where each action stands, and a
way to turn (rank, step) into a located diagnostic.

Built once per `check()` call. The position table maps an action code (see
`encoding.encode`) to its global index `rank << SHIFT | i` (i: index of the action in the
rank's list of actions), so rules can ask "is `2RECV_F3` there, and before `2F3`?" with one
list lookup, or ask it of every microbatch of every stage at once with a slice.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from ..diagnostics import Diagnostic, Severity
from ..ir import Program, Span
from ..memory import Sizes
from ..semantics import CommModel, Execution
from ..encoding import LOW as LOW, SHIFT as SHIFT, Encoded, encode
from ..gcpause import no_gc as no_gc

# `x & ABSENT_LAST` keeps a position and turns -1 (absent) into a number past every position:
# "is it later than ...?" is then false for an absent action, in one C-level map.
ABSENT_LAST = (1 << 62) - 1


# The way out for a program with sends and receives that `ppdsl expand --comms` cannot take
# as it stands (it lowers compute-only programs): said the same by every rule that offers it.
RELOWER = "delete the sends and receives and let `ppdsl expand --comms` place them (it cannot deadlock)"


def mb_ranges(mbs: Sequence[int]) -> str:
    """[0,1,2,5] -> `{0..2}`, `5` style text for compact messages."""
    out: list[str] = []
    items = sorted(mbs)
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        out.append(str(items[i]) if i == j else f"{{{items[i]}..{items[j]}}}")
        i = j + 1
    return ", ".join(out)


class Context:
    def __init__(self, program: Program, model: CommModel, max_memory: float | None,
                 memory_weights: Sequence[float] | None, max_bytes: tuple[float, Sizes] | None = None):
        self.program = program
        self.model = model
        self.max_memory = max_memory
        self.memory_weights = memory_weights
        self.max_bytes = max_bytes  # (limit, sizes of the program's stages)
        self.S, self.M = program.stages, program.microbatches
        self.enc: Encoded = encode(program)
        self.path = program.source.path if program.source is not None else "<input>"
        # Filled by the rules, read by later ones.
        self.failed: set[str] = set()  # rule families that reported an error
        self.execution: Execution | None = None
        self._span_cache: dict[int, tuple[list[int], list[list[tuple[int, int]] | None]]] = {}

    # -- tables ----------------------------------------------------------------------------
    @property
    def pos(self) -> list[int]:
        """code -> global index of its first occurrence, -1 where absent (`Encoded.pos`)."""
        return self.enc.pos

    def column(self, kind: int) -> list[int]:
        """`pos` of every (stage, microbatch) of one kind, indexed by `stage * M + mb`."""
        return self.enc.column(kind)

    @property
    def kinds(self) -> frozenset[int]:
        """The kinds of action the program uses."""
        return self.enc.kinds

    @property
    def has_comms(self) -> bool:
        return self.enc.has_comms

    def locate(self, g: int) -> tuple[int, int]:
        """(rank, step) of a global index."""
        rank, i = g >> SHIFT, g & LOW
        return rank, self.enc.step_of(rank, i)

    def text(self, code: int) -> str:
        return f"`{self.enc.describe(code)}`"

    # -- locations -------------------------------------------------------------------------
    def span(self, rank: int | None, step: int | None) -> Span:
        source = self.program.source
        if source is None:
            return Span(1, 1)
        if rank is None:
            return source.header
        if step is None or not (0 <= rank < len(source.steps)) or not source.steps[rank]:
            return source.rows[rank] if 0 <= rank < len(source.rows) and source.rows[rank] is not None else source.header  # type: ignore[return-value]
        cached = self._span_cache.get(rank)
        segments = source.steps[rank]
        assert segments is not None
        if cached is None:
            cached = ([s.first for s in segments], [None] * len(segments))
            self._span_cache[rank] = cached
        firsts, words = cached
        k = bisect.bisect_right(firsts, step) - 1
        if k < 0:
            return source.step_span(rank, step)
        seg = segments[k]
        w = words[k]
        if w is None:
            w = words[k] = seg.offsets()
        return seg.span(step - seg.first, w)

    def where(self, rank: int | None, step: int | None) -> str:
        """`path:line:col` of a step, for messages that name more than one place."""
        span = self.span(rank, step)
        return f"{self.path}:{span.line}:{span.column}"

    def diag(self, code: str, message: str, rank: int | None = None, step: int | None = None,
             help: str | None = None, notes: Sequence[str] = (), warning: bool = False) -> Diagnostic:
        span = self.span(rank, step)
        return Diagnostic(code, message, self.path, span.line, span.column, span.end_column,
                          Severity.WARNING if warning else Severity.ERROR, rank, step, help,
                          tuple(notes))  # type: ignore[arg-type]
