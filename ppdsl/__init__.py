"""ppdsl: write, check, simulate and run pipeline-parallel training schedules as data.

The public API needs only `lark` and `attrs`; nothing here imports paddle.
"""

from __future__ import annotations

from .diagnostics import Diagnostic, PpsError, Severity
from .ir import IDLE, Action, Batch, Idle, Kind, Overlap, Program, Step
from .load import load_program
from .syntax.parser import parse
from .syntax.printer import print_program

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
