"""ppdsl: write, check, simulate and run pipeline-parallel training schedules as data.

The public API needs only `lark` and `attrs`; nothing here imports paddle.
"""

from __future__ import annotations

import typing

from .diagnostics import Diagnostic, PpsError, Severity
from .ir import IDLE, Action, Batch, Idle, Kind, Overlap, Program, Step
from .load import load_program
from .syntax.printer import print_program

if typing.TYPE_CHECKING:
    from .load import parse

__version__ = "0.1.0"

__all__ = [
    "IDLE",
    "Action",
    "Batch",
    "Diagnostic",
    "Idle",
    "Kind",
    "Overlap",
    "PpsError",
    "Program",
    "Severity",
    "Step",
    "__version__",
    "load_program",
    "parse",
    "print_program",
]


def __getattr__(name: str) -> typing.Any:
    # `parse` imports Lark, a tenth of a second or more: commands that read only CSV files
    # (and `import ppdsl` itself) do without it until a .pps text is parsed. It is the one of
    # `load`, which applies every bound (`expansion.parse` leaves out `check_slots`).
    if name == "parse":
        from .load import parse

        return parse
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    # The public API only: not the submodules an import loads (`ir`, `load`, ...) or `typing`.
    return sorted(__all__)
