"""Pictures of a simulated schedule: terminal, Chrome trace JSON, SVG and HTML.

All of them draw a `timeline.Timeline`, built once from a `Simulation` (and diagnostics to mark).
"""

from __future__ import annotations

from .timeline import Slot, Timeline, build

__all__ = ["Slot", "Timeline", "build"]
