"""The timeline as an overview that fits a screen: a line per rank, a column per time bucket.

Each column stands for an equal share of the time shown; its glyph (and colour) is the kind
that fills most of that bucket on that rank: `F`, `B`, `I`, `W`, `+` for an overlapped pair,
`s`/`r` for sends and receives, `<` for a batch, `u` for unshard/reshard/reduce; `.` where
the rank is idle more than half of the bucket, blank where it does nothing at all; `!` where
a stuck or flagged step falls. Past the lines it may take, the last ranks are left out and
said. A line under the picture gives the flags that show the steps themselves.
"""

from __future__ import annotations

import math
import textwrap
from typing import Any

from ..kinds import PICTURES
from ..wording import plural
from ..simulate import Simulation
from .terminal import _rich, gutter_of, heading, to_text, use_colour
from .timeline import CATEGORIES, COLOURS, Timeline, kinds_in
from .timeline import short_number as _num

GLYPHS: dict[str, str] = {p.key: p.glyph for p in PICTURES}  # per category (`kinds.PICTURES`)
MOSTLY_IDLE = "."
FLAGGED = "!"
# Above the lanes: the heading and the ruler.
HEAD_LINES = 2


def buckets(timeline: Timeline, lanes: int, columns: int) -> list[list[dict[str, float]]]:
    """Per lane and column, the time each category takes in that bucket (`!` for flagged)."""
    span = max(timeline.end - timeline.origin, 1e-300)
    width = span / columns
    table: list[list[dict[str, float]]] = [[{} for _ in range(columns)] for _ in range(lanes)]
    for s in timeline.slots:
        if s.rank >= lanes:
            continue
        row = table[s.rank]
        a, b = (s.start - timeline.origin) / width, (s.end - timeline.origin) / width
        key = FLAGGED if s.status in ("stuck", "error") else s.category
        first, last = min(int(a), columns - 1), min(max(int(math.ceil(b)) - 1, int(a)), columns - 1)
        for c in range(first, last + 1):
            share = (min(b, c + 1) - max(a, c)) * width
            if share > 0 or s.start == s.end:
                row[c][key] = row[c].get(key, 0.0) + max(share, 0.0)
    return table


def glyph(bucket: dict[str, float], width: float) -> str:
    if not bucket:
        return " "
    if FLAGGED in bucket:
        return FLAGGED
    kind, busy = max(bucket.items(), key=lambda item: item[1])
    return GLYPHS[kind] if sum(bucket.values()) * 2 >= width else MOSTLY_IDLE


def render(sim: Simulation, timeline: Timeline, title: str, width: int, colour: bool | None, max_lines: int) -> str:
    coloured = use_colour(colour)
    rich = _rich()
    gutter = gutter_of(timeline)
    columns = max(1, width - gutter - 1)
    span = timeline.end - timeline.origin
    bucket_width = span / columns if span > 0 else 1.0
    legend = "  ".join(f"{GLYPHS[c]}={CATEGORIES[c]}" for c in kinds_in(timeline))
    scale = plural(bucket_width, 'time unit', _num(float(f'{bucket_width:.4g}')))

    def footer(lanes: int) -> list[str]:
        left_out = ""
        if lanes < timeline.ranks:
            first, last = timeline.rank_of(lanes), timeline.rank_of(timeline.ranks - 1)
            left_out = f"; rank {first} not shown" if first == last else f"; ranks {first}-{last} not shown"
        crop = f"0-{min(3, timeline.ranks - 2)}" if timeline.ranks > 2 else "0"  # fewer ranks than the picture has
        text = [f"legend: {legend}  .=mostly idle" + ("  !=stuck or flagged" if timeline.problems else ""),
                f"overview: 1 column = {scale}, the kind that takes most of it{left_out}",
                f"each step: crop with --ranks {crop} --from T --to T; --full: all, in pages; --svg/--html"]
        return [wrapped for line in text for wrapped in textwrap.wrap(line, width, subsequent_indent="  ")]

    lanes = min(timeline.ranks, max_lines)
    while lanes > 1 and HEAD_LINES + lanes + len(footer(lanes)) > max_lines:
        lanes -= 1
    table = buckets(timeline, lanes, columns)
    out: list[Any] = [textwrap.shorten(heading(sim, title), width, placeholder="...")]
    ruler = [" "] * columns
    for c in range(0, columns, 12):
        mark = _num(float(f"{timeline.origin + c * bucket_width:.4g}"))
        if c + len(mark) <= columns:
            ruler[c:c + len(mark)] = list(mark)
    out.append(" " * gutter + "".join(ruler).rstrip())
    for lane, row in enumerate(table):
        name = f"rank {timeline.rank_of(lane)}".ljust(gutter - 1) + "|"
        glyphs = [glyph(b, bucket_width) for b in row]
        if coloured:
            text = rich.text.Text(name)
            for g in glyphs:
                kind = next((k for k, v in GLYPHS.items() if v == g), None)
                style = "bold white on #d62728" if g == FLAGGED else (f"black on {COLOURS[kind]}" if kind else "")
                text.append(g, style=style)
            out.append(text)
        else:
            out.append(name + "".join(glyphs).rstrip())
    out.extend(footer(lanes))
    return to_text(out, coloured)
