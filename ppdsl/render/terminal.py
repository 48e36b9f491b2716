"""The timeline in a terminal: one lane per rank, one cell per time quantum, coloured by kind.

The quantum is the shortest compute step, so with unit costs every action is one cell; longer
actions span several cells and idle time is blank. Every cell carries the action's label, so
the picture reads without colour (`NO_COLOR`, pipes, or without `rich` installed). A timeline
wider than the terminal is cut into pages, one under the other, each with its time ruler.
Steps a stuck run never reached are shown after the last completed one in lower case; `!`
marks where a rank waits forever or what a diagnostic points at.
"""

from __future__ import annotations

import math
import os
import shutil
from typing import Any

from ..kinds import PICTURES
from ..wording import plural
from ..limits import MAX_PICTURE_CELLS
from ..simulate import Simulation, stuck_summary
from .timeline import CATEGORIES, Slot, Timeline, colour_of, kinds_in, max_chunks
from .timeline import short_number as _num

# Per category, its short name in the legend (`kinds.PICTURES`).
_LABELS: dict[str, str] = {p.key: p.label for p in PICTURES}
MAX_PROBLEM_LINES = 20  # under the picture; the diagnostics above it say the rest


def _rich() -> Any:
    try:
        import rich.console
        import rich.text
    except ImportError:
        return None
    return rich


def has_colour() -> bool:
    """Can the picture be coloured here (is the `show` extra, rich, installed)?"""
    return _rich() is not None


def terminal_width(default: int = 100) -> int:
    return shutil.get_terminal_size((default, 24)).columns


def _label(s: Slot, full: bool) -> str:
    text = s.text if full else s.short
    if s.status == "unreached":
        text = text.lower()
    if s.status in ("stuck", "error"):
        text = "!" + text
    return text


# Without colour, the cells a step spans after its label are filled with this, so that a
# two-cell `B0` does not read as a one-cell `B0` followed by idle time (which is blank).
PLAIN_FILL = "-"
COPY_LANE = "  copy"  # the name of a rank's copy lane, under the rank's own


def layout(sim: Simulation, timeline: Timeline, width: int, fill: str = " "
           ) -> tuple[list[list[tuple[str, Slot | None]]], float, int, list[str]]:
    """Per lane, a list of cells (text, slot or None for idle); the quantum; the cell width;
    each lane's name (a rank, or the copy lane under it). `fill` pads a step's cells after its
    label (the last blank always separates steps)."""
    durations = [s.duration for s in timeline.slots if s.duration > 0 and s.category not in ("SEND", "RECV")]
    if not durations:
        durations = [s.duration for s in timeline.slots if s.duration > 0] or [1.0]
    # One cell per shortest step, unless the lanes would then hold more than MAX_PICTURE_CELLS
    # cells in all, or four per step in a larger schedule (costs 1e-9 and 1e12 in one
    # schedule): then a coarser quantum, and steps shorter than a cell are not drawn.
    cells = max(MAX_PICTURE_CELLS, 4 * len(timeline.slots))
    span = timeline.end - timeline.origin
    quantum = max(min(durations), span * max(timeline.ranks, 1) / cells)
    full = max_chunks(sim) > 1
    texts = [_label(s, full) for s in timeline.slots]
    labels = [len(t) for t, s in zip(texts, timeline.slots) if s.duration >= quantum * 0.999]
    cell = min(max(labels, default=2) + 1, 12)
    columns = max(1, math.ceil(span / quantum - 1e-9))
    lanes: list[list[tuple[str, Slot | None]]] = [[] for _ in range(timeline.ranks)]
    # Offloads and reloads run on a copy lane beside the rank's computes: a line of their own
    # under the rank's, where it has any.
    copies: dict[int, list[tuple[str, Slot | None]]] = {}
    for s, text in zip(timeline.slots, texts):  # in step order per rank
        if s.duration <= 0:
            continue  # a free send/receive takes no room; the legend says so
        lane = copies.setdefault(s.rank, []) if s.copy else lanes[s.rank]
        c0 = int((s.start - timeline.origin) / quantum + 1e-9)
        if c0 < len(lane):
            if s.duration < quantum * 0.999:
                continue  # a step shorter than a cell never pushes the ones after it
            c0 = len(lane)  # rounding put two steps in one cell: keep both, in order
        c1 = max(c0 + 1, int(round((s.end - timeline.origin) / quantum)))
        lane.extend([(" " * cell, None)] * (c0 - len(lane)))
        span = (c1 - c0) * cell
        label = text[: span - 1]
        body = (label + fill * (span - 1 - len(label)) if c1 - c0 > 1 else label.ljust(span - 1)) + " "
        lane.extend((body[k * cell:(k + 1) * cell], s) for k in range(c1 - c0))
    lanes = [line for r, lane in enumerate(lanes) for line in ([lane, copies[r]] if r in copies else [lane])]
    names = [name for r in range(timeline.ranks)
             for name in ([f"rank {timeline.rank_of(r)}", COPY_LANE] if r in copies else [f"rank {timeline.rank_of(r)}"])]
    columns = max([columns, *(len(lane) for lane in lanes)])
    for lane in lanes:
        lane.extend([(" " * cell, None)] * (columns - len(lane)))
    return lanes, quantum, cell, names


# The steps past which the picture is the overview without trying the full one (which lays out
# every step: seconds for a few hundred thousand).
MAX_LAID_OUT = 50_000


def heading(sim: Simulation, title: str) -> str:
    """The picture's first line: its figures, or where a stuck schedule stops instead."""
    p = sim.program
    figures = f"makespan {_num(sim.makespan)}, bubble {100 * sim.bubble_ratio:.1f}%, " if sim.completed else ""
    return (f"{title}: {figures}{plural(p.ranks, 'rank')} x {plural(p.microbatches, 'microbatch')}, {sim.comm_model}"
            + ("" if sim.completed else f"  {stuck_summary(sim)}"))


def gutter_of(timeline: Timeline) -> int:
    return max((len(f"rank {timeline.rank_of(r)} ") for r in range(timeline.ranks)), default=7) + 1


def use_colour(colour: bool | None) -> bool:
    return _rich() is not None and (colour if colour is not None else not os.environ.get("NO_COLOR"))


def render(sim: Simulation, timeline: Timeline, title: str, width: int | None = None, colour: bool | None = None,
           max_lines: int | None = None) -> str | None:
    """The picture as text (with ANSI colours when `colour` and rich allow): every step, in
    pages; None when that takes more than `max_lines` lines (`overview` draws those)."""
    width = width or terminal_width()
    if max_lines is not None and len(timeline.slots) > MAX_LAID_OUT:
        return None
    rich = _rich()
    coloured = use_colour(colour)
    lanes, quantum, cell, names = layout(sim, timeline, width, " " if coloured else PLAIN_FILL)
    gutter = gutter_of(timeline)
    per_page = max(1, (width - gutter) // cell)
    columns = len(lanes[0]) if lanes else 0
    pages = math.ceil(columns / per_page)
    if max_lines is not None and pages * (len(lanes) + 2) + 4 > max_lines:
        return None
    chunks = max_chunks(sim)
    out_lines: list[Any] = [heading(sim, title)]
    for page in range(0, columns, per_page):
        stop = min(columns, page + per_page)
        ruler = [" "] * ((stop - page) * cell)
        tick = max(1, math.ceil(8 / cell))
        for c in range(page, stop, tick):
            mark = _num(timeline.origin + c * quantum)
            pos = (c - page) * cell
            if pos + len(mark) <= len(ruler):
                ruler[pos:pos + len(mark)] = list(mark)
        out_lines.append(" " * gutter + "".join(ruler).rstrip())
        for lane, lane_name in zip(lanes, names):
            name = lane_name.ljust(gutter - 1) + "|"
            if coloured:
                text = rich.text.Text(name)
                for chunk, slot in lane[page:stop]:
                    text.append(chunk, style=_style(slot, chunks) if slot is not None else "")
                out_lines.append(text)
            else:
                out_lines.append(name + "".join(chunk for chunk, _ in lane[page:stop]).rstrip())
        if stop < columns:
            out_lines.append("")
    legend = "  ".join(f"{_short_legend(c)}={CATEGORIES[c]}" for c in kinds_in(timeline))
    notes = [f"legend: {legend}; 1 cell = {plural(quantum, 'time unit', _num(quantum))}"]
    if not coloured and any(c1 - c0 > 1 for c0, c1 in _spans(lanes)):
        notes[0] += f"; `{PLAIN_FILL}` continues the step before it"
    free = sum(s.duration <= 0 for s in timeline.slots if s.category in ("SEND", "RECV", "BATCH"))
    if free:
        comms = sum(s.category in ("SEND", "RECV", "BATCH") for s in timeline.slots)
        which = "sends/receives" if free == comms else f"{free} of the {comms} sends/receives"
        notes.append(f"{which} take no time under these costs and are not drawn (--costs comm=... gives them one)")
    if chunks > 1:
        notes.append("labels are stage+kind+microbatch (ranks hold several stages)")
    if timeline.problems:
        notes.append("lower case: never reached; !: stuck or flagged")
        notes.extend("  " + line for line in timeline.problems[:MAX_PROBLEM_LINES])
        if len(timeline.problems) > MAX_PROBLEM_LINES:
            notes.append(f"  ... and {len(timeline.problems) - MAX_PROBLEM_LINES} more")
    out_lines.extend(notes)
    if max_lines is not None and len(out_lines) > max_lines:
        return None
    return to_text(out_lines, coloured)


def to_text(out_lines: list[Any], coloured: bool) -> str:
    """Lines of str or rich Text as the terminal gets them."""
    if coloured:
        rich = _rich()
        console = rich.console.Console(width=10**6, force_terminal=True, color_system="auto", no_color=False,
                                       highlight=False, soft_wrap=True, record=False, file=_Sink())
        with console.capture() as cap:
            for line in out_lines:
                console.print(line)
        return str(cap.get())
    return "\n".join(str(line) for line in out_lines) + "\n"


def _spans(lanes: list[list[tuple[str, Slot | None]]]) -> list[tuple[int, int]]:
    """(first cell, end cell) of every drawn step."""
    out = []
    for lane in lanes:
        c = 0
        while c < len(lane):
            slot = lane[c][1]
            end = c + 1
            while slot is not None and end < len(lane) and lane[end][1] is slot:
                end += 1
            if slot is not None:
                out.append((c, end))
            c = end
    return out


class _Sink:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        return None


def _style(slot: Slot, chunks: int) -> str:
    if slot.status == "unreached":
        return "dim"
    colour = colour_of(slot, chunks)
    fg = "black" if _light(colour) else "white"
    style = f"{fg} on {colour}"
    if slot.status in ("stuck", "error"):
        style = f"bold white on #d62728"
    return style


def _light(hex_colour: str) -> bool:
    r, g, b = (int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return 0.299 * r + 0.587 * g + 0.114 * b > 0.55


def _short_legend(category: str) -> str:
    return _LABELS.get(category, category)
