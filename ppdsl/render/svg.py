"""SVG and self-contained HTML pictures of a timeline: time on x, ranks on y.

Every step is a rectangle coloured by kind (a rank's later stages in lighter shades), with its
token written inside when it fits and a `<title>` tooltip with the details. The title line
carries the makespan and the bubble; a legend and a time axis close the picture. Steps a stuck
run never reached are drawn hollow and dashed; the step where a rank waits forever, and any
step a diagnostic points at, get a red outline.
"""

from __future__ import annotations

import html
import math

from ..wording import plural
from ..simulate import Simulation, applying_to, stuck_summary
from .timeline import CATEGORIES, COLOURS, Slot, Timeline, colour_of, kinds_in, max_chunks
from .timeline import short_number as _num

FONT = "DejaVu Sans, Verdana, Arial, sans-serif"
CHAR_W = 6.6  # average glyph width at 11px, to decide whether a label fits
# Label sizes tried in turn, (font size, average glyph width): a smaller font before no label,
# so schedules of many short steps (ZB-V, DualPipeV) are still labelled at the default width.
LABEL_FONTS = ((11, CHAR_W), (9, 5.4), (7.5, 4.5))
LABEL_PAD = 4  # px left free around a label inside its rectangle
RED = "#d62728"


def _nice_step(span: float, target: int = 10) -> float:
    if span <= 0:
        return 1.0
    raw = span / target
    mag: float = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _luminance(hex_colour: str) -> float:
    r, g, b = (int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return 0.299 * r + 0.587 * g + 0.114 * b


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def render_svg(sim: Simulation, timeline: Timeline, title: str, width: int = 1200, interactive: bool = False) -> str:
    ranks = timeline.ranks
    lane = 26 if ranks <= 16 else max(8, 420 // ranks)
    gap = 4 if lane >= 16 else 1
    left, right_margin = 64, 16
    top = 68
    plot_w = max(200, width - left - right_margin)
    end = timeline.end - timeline.origin if timeline.end > timeline.origin else 1.0  # the width of time drawn
    scale = plot_w / end
    plot_h = ranks * (lane + gap) - gap
    kinds = kinds_in(timeline)
    legend_y = top + plot_h + 40
    legend_rows = 1 + (len(kinds) + 2) // 7
    problems = list(timeline.problems[:6])
    height = legend_y + 22 * legend_rows + (16 * (len(problems) + 1) if problems else 0) + 8
    chunks = max_chunks(sim)
    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'font-family="{FONT}" font-size="11">',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
    ]
    p = sim.program
    status = "" if sim.completed else f"  ({stuck_summary(sim)})"
    out.append(f'<text x="{left}" y="22" font-size="15" font-weight="bold">{_esc(title)}{_esc(status)}</text>')
    costs = " ".join(f"{k}={_num(v)}" for k, v in sim.costs.describe(p.stages, *applying_to(p)).items())
    figures = f"makespan {_num(sim.makespan)} · bubble {100 * sim.bubble_ratio:.1f}% · " if sim.completed else ""
    sub = (f"{figures}{plural(p.ranks, 'rank')}, "
           f"{plural(p.stages, 'stage')}, {plural(p.microbatches, 'microbatch')} · {sim.comm_model} · {costs}")
    out.append(f'<text x="{left}" y="40" fill="#444">{_esc(sub)}</text>')
    # Lanes and the time grid.
    step = _nice_step(end)
    for r in range(ranks):
        y = top + r * (lane + gap)
        out.append(f'<rect x="{left}" y="{y}" width="{plot_w:.1f}" height="{lane}" fill="#f4f4f4"/>')
        if lane >= 10 or r % max(1, ranks // 16) == 0:
            out.append(f'<text x="{left - 8}" y="{y + lane / 2 + 4:.1f}" text-anchor="end">rank {timeline.rank_of(r)}</text>')
    t = 0.0
    while t <= end + 1e-9:
        x = left + t * scale
        out.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{top + plot_h + 4}" stroke="#dddddd" stroke-width="1"/>')
        out.append(f'<text x="{x:.1f}" y="{top + plot_h + 18}" text-anchor="middle" fill="#555">{_num(float(f"{timeline.origin + t:.6g}"))}</text>')
        t += step
    mx = left + min(max(sim.makespan - timeline.origin, 0.0), end) * scale
    out.append(f'<line x1="{mx:.1f}" y1="{top - 8}" x2="{mx:.1f}" y2="{top + plot_h + 6}" stroke="#333" '
               f'stroke-width="1.5" stroke-dasharray="4 3"/>')
    out.append(f'<text x="{mx:.1f}" y="{top - 10}" text-anchor="end" fill="#333" font-size="10">makespan '
               f'{_num(sim.makespan)}</text>')
    # The steps.
    # A rank with offloads or reloads: its computes in the upper part of its lane, its copy
    # lane (they run beside the computes) in a strip under them.
    with_copies = {s.rank for s in timeline.slots if s.copy}
    strip = round(lane * 0.4)
    for s in timeline.slots:
        band = ((0, lane) if s.rank not in with_copies else (lane - strip, strip) if s.copy
                else (0, lane - strip - 1))
        out.append(_slot(s, left - timeline.origin * scale, top, band, gap, scale, chunks, interactive,
                         timeline.rank_of(s.rank), lane))
    # Legend.
    x, y = left, legend_y
    for c in kinds:
        label = CATEGORIES[c]
        if c == "OVERLAP":  # drawn as a forward over a backward
            out.append(f'<rect x="{x}" y="{y - 10}" width="14" height="6" fill="{COLOURS["F"]}"/>'
                       f'<rect x="{x}" y="{y - 4}" width="14" height="6" fill="{COLOURS["B"]}"/>')
        else:
            out.append(f'<rect x="{x}" y="{y - 10}" width="14" height="12" fill="{COLOURS[c]}" stroke="#333" '
                       'stroke-width="0.5"/>')
        out.append(f'<text x="{x + 19}" y="{y}">{_esc(label)}</text>')
        x += 30 + int(len(label) * CHAR_W)
        if x > width - 150:
            x, y = left, y + 22
    if any(s.status != "ok" for s in timeline.slots):
        out.append(f'<rect x="{x}" y="{y - 10}" width="14" height="12" fill="#ffffff" stroke="{RED}" stroke-width="2"/>')
        out.append(f'<text x="{x + 19}" y="{y}">stuck / flagged</text>')
        x += 130
        out.append(f'<rect x="{x}" y="{y - 10}" width="14" height="12" fill="#ffffff" stroke="#777" stroke-dasharray="3 2"/>')
        out.append(f'<text x="{x + 19}" y="{y}">never reached</text>')
    if chunks > 1:
        out.append(f'<text x="{width - right_margin}" y="{y}" text-anchor="end" fill="#555">lighter: a rank\'s later stages</text>')
    if problems:
        y += 22
        for line in problems:
            out.append(f'<text x="{left}" y="{y}" fill="{RED}">{_esc(line)}</text>')
            y += 16
        if len(timeline.problems) > len(problems):
            out.append(f'<text x="{left}" y="{y}" fill="{RED}">... {len(timeline.problems) - len(problems)} more</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _slot(s: Slot, left: float, top: float, band: tuple[int, int], gap: int, scale: float, chunks: int,
          interactive: bool, rank: int, height: int) -> str:
    """One step; `left` is where time 0 would be, `rank` the rank its lane draws, `band` the
    part of the lane (of `height`) it takes: from its top, how high."""
    x = left + s.start * scale
    w = max(s.duration * scale, 1.0)
    y = top + s.rank * (height + gap) + band[0]
    lane = band[1]
    fill = colour_of(s, chunks)
    stroke, sw, dash = "#ffffff", 0.8, ""
    text_fill = "#111111" if _luminance(fill) > 0.55 else "#ffffff"
    if s.status == "unreached":
        fill, stroke, dash, text_fill = "#ffffff", "#777777", ' stroke-dasharray="3 2"', "#777777"
    elif s.status in ("stuck", "error"):
        stroke, sw = RED, 2.5
        if s.status == "stuck":
            fill, text_fill = "#fde0e0", RED
    tip = (f"rank {rank} step {s.step}: {s.text}\nstart {_num(s.start)}  end {_num(s.end)}  "
           f"duration {_num(s.duration)}" + ("" if s.status == "ok" else f"\n{s.status.upper()}") +
           (f"\n{s.note}" if s.note else ""))
    attrs = ""
    if interactive:
        attrs = (f' class="slot" data-mb="{"" if s.microbatch is None else s.microbatch}" data-tip="{_esc(tip)}"')
    parts = [f'<g{attrs}><title>{_esc(tip)}</title>']
    if s.category == "OVERLAP" and s.status == "ok":
        half = lane / 2
        parts.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{half:.1f}" fill="{COLOURS["F"]}"/>')
        parts.append(f'<rect x="{x:.2f}" y="{y + half:.1f}" width="{w:.2f}" height="{half:.1f}" fill="{COLOURS["B"]}"/>')
        parts.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{lane}" fill="none" stroke="{stroke}" stroke-width="{sw}"/>')
        text_fill = "#ffffff"
    else:
        parts.append(f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{lane}" fill="{fill}" stroke="{stroke}" '
                     f'stroke-width="{sw}"{dash}/>')
    if lane >= 14:
        fitted = _fit_label(s, w)
        if fitted is not None:
            label, size = fitted
            font = "" if size == LABEL_FONTS[0][0] else f' font-size="{size}"'
            parts.append(f'<text x="{x + w / 2:.2f}" y="{y + lane / 2 + 4:.1f}" text-anchor="middle" fill="{text_fill}"'
                         f'{font} pointer-events="none">{_esc(label)}</text>')
    parts.append("</g>")
    return "".join(parts)


def _fit_label(s: Slot, width: float) -> tuple[str, float] | None:
    """The most telling label that fits `width` px, and its font size: the step as written, at
    the largest size that fits it, then the short form; None when not even that fits."""
    for text in dict.fromkeys((s.text, s.short)):
        for size, glyph in LABEL_FONTS:
            if len(text) * glyph + LABEL_PAD <= width:
                return text, size
    return None


_CSS = """
body { font-family: DejaVu Sans, Verdana, Arial, sans-serif; margin: 16px; color: #222; }
.slot:hover rect { stroke: #000; stroke-width: 2; }
.dim rect { opacity: 0.25; }
#details { position: sticky; top: 0; background: #fffbe6; border: 1px solid #e0d8a8; padding: 6px 10px;
           min-height: 2.6em; white-space: pre; font-family: monospace; margin-bottom: 8px; }
"""

_JS = """
const details = document.getElementById('details');
const slots = Array.from(document.querySelectorAll('.slot'));
for (const s of slots) {
  s.addEventListener('mouseenter', () => {
    details.textContent = s.dataset.tip;
    const mb = s.dataset.mb;
    if (mb !== '') for (const o of slots) if (o.dataset.mb !== mb) o.classList.add('dim');
  });
  s.addEventListener('mouseleave', () => { for (const o of slots) o.classList.remove('dim'); });
}
"""


def render_html(sim: Simulation, timeline: Timeline, title: str, width: int = 1200) -> str:
    """One file, no external resources: the SVG inline, details of the step under the pointer
    above it, and the other microbatches dimmed so one microbatch's path stands out."""
    svg = render_svg(sim, timeline, title, width, interactive=True)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body>\n"
            "<div id=\"details\">Point at a step for its details; its microbatch stays highlighted.</div>\n"
            f"{svg}<script>{_JS}</script>\n</body></html>\n")
