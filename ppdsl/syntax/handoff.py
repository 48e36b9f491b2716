"""What the reader hands the expansion of a `use` line (`ppdsl/expansion.py`): the line as
written (`UseLine`) and the file read up to it (`Unexpanded`), the header already checked."""

from __future__ import annotations

from typing import Union

from attrs import field, frozen

from ..diagnostics import Diagnostic
from ..ir import Span

Value = Union[int, float, str, tuple[int, ...]]  # an option's value as written



@frozen
class UseLine:
    """A `use NAME(ARG=VALUE, ...)` line as written: what runs it (`ppdsl/expansion.py`) tells a
    generator's problem under the argument it names, else under the name."""

    name: str
    name_span: Span
    arguments: tuple[tuple[str, Value], ...]
    argument_spans: dict[str, Span]
    span: Span  # the whole line (`end_column` None when it goes on past its first line)


@frozen
class Unexpanded:
    """A file whose rows a `use` line makes, read up to that line: the header as checked (sizes
    within their bounds, a placement that fits them) and the line, for the expansion to run."""

    path: str
    text: str = field(repr=False)
    header: Span
    options: dict[str, Span]  # where the header writes each option
    ranks: int
    microbatches: int
    stages: int | None  # None: the generator's count
    placement: tuple[int, ...] | None  # the header's, when it gives one
    placement_name: str | None  # `placement=loop` or `=v`: a shape taken at the generator's count
    mode: str
    memory: float | None
    costs: tuple[tuple[str, float], ...]
    use: UseLine
    steps_limit: int
    # Errors noted while reading that did not stop it (a line Lark refused): told with the
    # expansion's own, or alone once it succeeds.
    found: tuple[Diagnostic, ...] = ()
    costs_line: Span | None = None  # where the `costs` line starts, when there is one
    cost_spans: dict[str, Span] = field(factory=dict)  # where that line writes each key
    limit_words: str = ""  # how an error says `steps_limit` (`limits.file_limit`)
