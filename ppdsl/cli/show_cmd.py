"""Draw a schedule's simulated timeline: in the terminal, or as Chrome trace, SVG or HTML.

Without --trace/--svg/--html the timeline is printed: one lane per rank, colours by kind
(with the `show` extra, i.e. rich; plain text otherwise or with NO_COLOR), cut into pages
when wider than the terminal. A schedule with errors is still drawn: the steps that ran at
their times, the rest after them, and the offending steps marked.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..diagnostics import UsageError
from ..ir import Program
from ..limits import MAX_EXPANDED_ACTIONS, MAX_WIDTH
from ..render import terminal
from ..render.svg import render_html, render_svg
from ..render.timeline import build
from ..render.trace import render_trace
from .common import SHOWN_DIAGNOSTICS, print_diagnostics, refuse_overwriting, whole_number, write_output
from .simulate_cmd import add_common, diagnostics_for, load_and_simulate

MIN_WIDTH = 20  # a lane label and a few cells
# A picture beyond this is megabytes of SVG no viewer draws well, or thousands of terminal
# pages; and drawing it takes ~35 us a step (192,000 steps: 6.7 s of CPU, measured): it is
# the bound a generated file has too (limits.MAX_EXPANDED_ACTIONS).
MAX_PICTURE_STEPS = MAX_EXPANDED_ACTIONS
# What each output writes, by file name ending (a name without one is taken as given).
SUFFIXES = {"trace": (".json",), "svg": (".svg",), "html": (".html", ".htm")}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="a .pps or .csv schedule")
    add_common(p)
    p.add_argument("--trace", metavar="OUT.json", help="write Chrome trace JSON (open in ui.perfetto.dev)")
    p.add_argument("--svg", metavar="OUT.svg", help="write an SVG picture")
    p.add_argument("--html", metavar="OUT.html", help="write a self-contained HTML page with hover details")
    p.add_argument("--width", type=whole_number(MIN_WIDTH, MAX_WIDTH), metavar="N",
                   help="terminal: characters per line (default: the terminal's); svg/html: pixels (default 1200)")
    p.add_argument("--title", help="title of the picture (default: the file name)")
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
    for path, _ in wanted:
        for source in [args.file, *args.costs]:
            refuse_overwriting(source, path)
    pictures = not wanted or any(kind != "trace" for _, kind in wanted)
    sim = load_and_simulate(args.file, args, refuse_too_big if pictures else None)
    problems = diagnostics_for(sim)
    print_diagnostics(problems, limit=SHOWN_DIAGNOSTICS)
    timeline = build(sim, problems)
    title = args.title or Path(args.file).name
    for path, kind in wanted:
        if kind == "trace":
            text = render_trace(sim, timeline, title)
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
        sys.stdout.write(terminal.render(sim, timeline, title, args.width, colour))
    return 1 if problems else 0


def refuse_too_big(program: Program) -> None:
    """A picture (terminal, SVG, HTML) of more steps than MAX_PICTURE_STEPS is refused before
    it is simulated: no one reads it, and drawing it takes longer than a command should."""
    count = program.action_count
    if count > MAX_PICTURE_STEPS:
        raise UsageError(f"{count:,} actions are too many for a picture (at most {MAX_PICTURE_STEPS:,}); "
                         "`ppdsl simulate` gives the numbers, and --trace writes a timeline Perfetto "
                         "(ui.perfetto.dev) opens at any size")
