"""Draw a schedule's simulated timeline: in the terminal, or as Chrome trace, SVG or HTML.

Without --trace/--svg/--html the timeline is printed: one lane per rank, colours by kind
(with the `show` extra, i.e. rich; plain text otherwise or with NO_COLOR), cut into pages
when wider than the terminal. A picture longer than --lines (default 50) is an overview
instead: a column per time bucket, the kind that fills most of it. --ranks, --from and --to
crop the terminal picture, the SVG and the HTML. A schedule with errors is still drawn: the
steps that ran at their times, the rest after them, and the offending steps marked.

  ppdsl show big.pps                             # fits the screen, whatever the size
  ppdsl show big.pps --ranks 0-3 --from 0 --to 200
  ppdsl show big.pps --ranks 0,2,5-7 --svg part.svg
  ppdsl show best.pps --costs profile.json       # ...and each rank's peak bytes, by its sizes
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..diagnostics import UsageError
from ..memory import bytes_text
from ..simulate import Simulation
from ..limits import DEFAULT_MAX_PICTURE_STEPS, MAX_COST, MAX_RANKS, MAX_WIDTH
from ..render import overview, terminal
from ..render.svg import render_html, render_svg
from ..render.timeline import Timeline, build, crop
from ..render.trace import render_trace
from .common import SHOWN_DIAGNOSTICS, add_max_steps, number, print_diagnostics, refuse_overwriting, whole_number, write_output
from .simulate_cmd import add_common, diagnostics_for, load_and_simulate

MIN_WIDTH = 20  # a lane label and a few cells
DEFAULT_WIDTH = 120  # terminal: when the output is not a terminal
DEFAULT_LINES = 50  # terminal: a screen; past it, the overview
# What each output writes, by file name ending (a name without one is taken as given).
SUFFIXES = {"trace": (".json",), "svg": (".svg",), "html": (".html", ".htm")}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="a .pps or .csv schedule")
    add_common(p)
    add_max_steps(p, DEFAULT_MAX_PICTURE_STEPS)
    p.add_argument("--trace", metavar="OUT.json", help="write Chrome trace JSON (open in ui.perfetto.dev)")
    p.add_argument("--svg", metavar="OUT.svg", help="write an SVG picture")
    p.add_argument("--html", metavar="OUT.html", help="write a self-contained HTML page with hover details")
    p.add_argument("--width", type=whole_number(MIN_WIDTH, MAX_WIDTH), metavar="N",
                   help="terminal: characters per line (default: the terminal's); svg/html: pixels (default 1200)")
    p.add_argument("--title", help="title of the picture (default: the file name)")
    p.add_argument("--ranks", type=rank_list, metavar="LIST",
                   help="draw only these ranks: 3, 0-7, 0,2,5-7 (terminal, svg, html)")
    p.add_argument("--from", dest="start", type=number(0, MAX_COST, low_inclusive=True), metavar="T",
                   help="draw from time T on, in the cost unit (terminal, svg, html)")
    p.add_argument("--to", dest="end", type=number(0, MAX_COST), metavar="T",
                   help="draw up to time T, in the cost unit (terminal, svg, html)")
    p.add_argument("--lines", type=whole_number(8, MAX_WIDTH), default=DEFAULT_LINES, metavar="N",
                   help=f"terminal: past N lines draw the overview (default {DEFAULT_LINES})")
    p.add_argument("--full", action="store_true", help="terminal: every step, in pages, however many lines")
    colour = p.add_mutually_exclusive_group()
    colour.add_argument("--color", "--colour", dest="colour", action="store_true", default=None,
                        help="terminal: colours even when not writing to a terminal")
    colour.add_argument("--no-color", "--no-colour", dest="colour", action="store_false",
                        help="terminal: plain text (as NO_COLOR=1)")


def run(args: argparse.Namespace) -> int:
    outputs = [(args.trace, "trace"), (args.svg, "svg"), (args.html, "html")]
    wanted = [(path, kind) for path, kind in outputs if path]
    for path, kind in wanted:
        suffix = Path(path).suffix.lower()
        if path != "-" and suffix and suffix not in SUFFIXES[kind]:
            raise UsageError(f"--{kind} {path}: writes {kind.upper() if kind != 'trace' else 'Chrome trace JSON'}, "
                             f"not {suffix[1:]}: name the file {Path(path).with_suffix(SUFFIXES[kind][0])}")
    named = [os.path.realpath(path) if path != "-" else path for path, _ in wanted]
    for i, (path, kind) in enumerate(wanted):
        if named[i] in named[:i]:
            other = wanted[named.index(named[i])][1]
            raise UsageError(f"--{kind} and --{other} both write {path}: give each its own file")
    for path, _ in wanted:
        for source in [args.file, *args.costs]:
            refuse_overwriting(source, path)
    if args.start is not None and args.end is not None and args.end <= args.start:
        raise UsageError(f"--to {args.end:g} is not after --from {args.start:g}")
    args.max_steps = args.max_steps or DEFAULT_MAX_PICTURE_STEPS
    sim = load_and_simulate(args.file, args)
    problems = diagnostics_for(sim)
    print_diagnostics(problems, limit=SHOWN_DIAGNOSTICS)
    whole = build(sim, problems)
    timeline = cropped(whole, args, sim.program.ranks)
    title = args.title or Path(args.file).name
    for path, kind in wanted:
        if kind == "trace":
            text = render_trace(sim, whole, title)
        elif kind == "svg":
            text = render_svg(sim, timeline, title, args.width or 1200)
        else:
            text = render_html(sim, timeline, title, args.width or 1200)
        write_output(path, text)
        if path != "-":
            print(f"wrote {path}", file=sys.stderr)
    if not wanted:
        colour = args.colour
        if colour and not terminal.has_colour():
            print("ppdsl show: --color needs rich, which is not installed: pip install 'ppdsl[show]' "
                  "(drawing in plain text)", file=sys.stderr)
        if colour is None:
            colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        width = args.width or (terminal.terminal_width(DEFAULT_WIDTH) if sys.stdout.isatty() else DEFAULT_WIDTH)
        picture = terminal.render(sim, timeline, title, width, colour, None if args.full else args.lines)
        if picture is None:
            picture = overview.render(sim, timeline, title, width, colour, args.lines)
        sys.stdout.write(picture)
        memory = bytes_line(sim)
        if memory is not None:
            print(memory)
    return 1 if problems else 0


def bytes_line(sim: Simulation) -> str | None:
    """Each rank's peak bytes, when the costs carry a profile's sizes for the program's stages."""
    found = sim.peak_bytes
    if found is None:
        return None
    ranks = ", ".join(f"rank {r} {bytes_text(b)}" for r, b in enumerate(found.peak))
    return (f"peak memory: {ranks} (weights, gradients and optimizer state and the peak of live activations, "
            "by the profile's sizes)")


def rank_list(text: str) -> tuple[int, ...]:
    """An argparse type: `3`, `0-7`, `0,2,5-7` as the ranks in that order, each once."""
    ranks: dict[int, None] = {}  # in order, each once
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if not (low.isdigit() and (not dash or high.isdigit())) or len(part) > 20:
            raise argparse.ArgumentTypeError(f"expected ranks such as 3, 0-7 or 0,2,5-7, not `{text[:40]}`")
        a, b = int(low), int(high) if dash else int(low)
        if b < a or b >= MAX_RANKS:
            raise argparse.ArgumentTypeError(f"`{part}` is no range of ranks (from low to high, below {MAX_RANKS:,})")
        ranks.update(dict.fromkeys(range(a, b + 1)))
    return tuple(ranks)


def cropped(timeline: Timeline, args: argparse.Namespace, ranks: int) -> Timeline:
    """The part of the timeline --ranks, --from and --to ask for (all of it without them)."""
    if args.ranks is None and args.start is None and args.end is None:
        return timeline
    if args.ranks is not None and max(args.ranks) >= ranks:
        raise UsageError(f"--ranks: rank {max(args.ranks)} is not in the schedule (ranks 0-{ranks - 1})")
    if args.start is not None and args.start >= timeline.end:
        raise UsageError(f"--from {args.start:g} is past the end of the timeline ({timeline.end:g})")
    return crop(timeline, args.ranks, args.start, args.end)
