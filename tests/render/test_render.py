"""Pictures: terminal text, Chrome trace, SVG and HTML, for sound and for broken schedules."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import SCHEDULES
from ppdsl import load_program, parse
from ppdsl.costs import CostModel
from ppdsl.render import terminal
from ppdsl.render.svg import render_html, render_svg
from ppdsl.render.timeline import build
from ppdsl.render.trace import render_trace
from ppdsl.simulate import Simulation, simulate

ANSI = re.compile(r"\x1b\[")
STUCK = ("pipeline ranks=2 microbatches=2\ncosts comm=0.5\n"
         "rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1\n"
         "rank 1: 1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1\n")


def one_f_one_b(**kv: float) -> Simulation:
    program = parse("pipeline ranks=4 microbatches=8\nuse 1f1b()\n", "1f1b.pps")
    return simulate(program, CostModel(tuple(kv.items())) if kv else CostModel((("F", 1.0), ("B", 1.0))))


def test_terminal_plain_has_one_cell_per_action_at_unit_cost() -> None:
    sim = one_f_one_b()
    text = terminal.render(sim, build(sim), "1f1b", width=120, colour=False)
    assert not ANSI.search(text)
    lanes = [line for line in text.splitlines() if line.startswith("rank ")]
    assert len(lanes) == 4
    assert lanes[3].split("|")[1].split() == [w for m in range(8) for w in (f"F{m}", f"B{m}")]
    # rank 0 waits 3 cells (its bubble) between F3 and B0
    assert re.search(r"F3 {10}B0", lanes[0])
    assert "makespan 22, bubble 27.3%" in text


def test_terminal_pages_when_too_wide() -> None:
    sim = one_f_one_b(F=1, B=2)
    text = terminal.render(sim, build(sim), "1f1b", width=60, colour=False)
    assert all(len(line) <= 60 for line in text.splitlines() if line.startswith("rank "))
    assert sum(line.startswith("rank 0") for line in text.splitlines()) >= 2


def test_terminal_colour_and_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("rich")
    sim = one_f_one_b()
    assert ANSI.search(terminal.render(sim, build(sim), "t", width=120, colour=True))
    monkeypatch.setenv("NO_COLOR", "1")
    assert not ANSI.search(terminal.render(sim, build(sim), "t", width=120))


def test_terminal_marks_a_stuck_schedule() -> None:
    sim = simulate(parse(STUCK, "s.pps"))
    text = terminal.render(sim, build(sim), "s", width=120, colour=False)
    assert "STUCK" in text and "!SF1" in text and "!SB0" in text
    assert "b1" in text  # never reached: drawn, in lower case


def test_trace_structure() -> None:
    text = ("pipeline ranks=2 microbatches=2\ncosts comm=0.5\n"
            "rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1\n"
            "rank 1: 1RECV_F0 1F0 1RECV_F1 1B0 1SEND_B0 1F1 1B1 1SEND_B1\n")
    sim = simulate(parse(text, "t.pps"), comm_model="buffered")
    assert sim.completed
    data = json.loads(render_trace(sim, build(sim), "t"))
    events = data["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {0: "rank 0", 1: "rank 1"}
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == 16
    f3 = next(e for e in slices if e["name"] == "0F1")
    assert f3["args"]["stage"] == 0 and f3["args"]["microbatch"] == 1 and f3["args"]["kind"] == "F"
    starts = [e for e in events if e["ph"] == "s"]
    finishes = [e for e in events if e["ph"] == "f"]
    assert len(starts) == len(finishes) == 4  # two activations, two gradients
    for s in starts:
        f = next(f for f in finishes if f["id"] == s["id"])
        assert s["pid"] != f["pid"] and f["ts"] >= s["ts"]
    assert data["otherData"]["makespan"] == sim.makespan


def test_trace_flows_in_compute_only_program() -> None:
    sim = one_f_one_b()
    data = json.loads(render_trace(sim, build(sim), "t"))
    flows = [e for e in data["traceEvents"] if e["ph"] == "s"]
    assert len(flows) == 2 * 3 * 8  # F and B across each of the 3 boundaries, 8 microbatches


def _svg(sim: Simulation, title: str = "t") -> ET.Element:
    return ET.fromstring(render_svg(sim, build(sim), title))


def test_svg_is_well_formed_with_title_legend_and_one_rect_per_step() -> None:
    sim = one_f_one_b(F=1, B=2)
    root = _svg(sim, "1f1b.pps")
    ns = "{http://www.w3.org/2000/svg}"
    texts = [t.text or "" for t in root.iter(f"{ns}text")]
    assert texts[0] == "1f1b.pps" and "makespan 33" in texts[1] and "bubble 27.3%" in texts[1]
    assert "forward" in texts and "backward" in texts
    titles = [t.text or "" for t in root.iter(f"{ns}title")]
    assert len(titles) == 64 and any("rank 3 step 1: 3B0" in t for t in titles)


def test_svg_marks_stuck_and_unreached() -> None:
    sim = simulate(parse(STUCK, "s.pps"))
    svg = render_svg(sim, build(sim), "s")
    ET.fromstring(svg)
    assert "STUCK" in svg and 'stroke="#d62728"' in svg and 'stroke-dasharray="3 2"' in svg
    assert "never reached" in svg


def test_html_is_self_contained() -> None:
    sim = one_f_one_b()
    page = render_html(sim, build(sim), "t")
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "<script>" in page
    assert not re.search(r"""(src|href)=["']https?:""", page)
    assert page.count('class="slot"') == 64


@pytest.mark.parametrize("path", sorted(SCHEDULES.glob("*.pps")), ids=lambda p: p.name)
def test_schedules_render(path: Path, tmp_path: Path) -> None:
    """Every schedule in schedules/ draws; with rsvg-convert present the SVG also becomes a PNG."""
    program = load_program(str(path))
    sim = simulate(program, CostModel((("F", 1.0), ("B", 2.0), ("comm", 0.1))))
    assert sim.completed, path.name
    svg = tmp_path / "t.svg"
    svg.write_text(render_svg(sim, build(sim), path.name))
    ET.parse(svg)
    if shutil.which("rsvg-convert"):
        png = tmp_path / "t.png"
        subprocess.run(["rsvg-convert", "-o", str(png), str(svg)], check=True, timeout=60)
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_terminal_without_rich_is_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(terminal, "_rich", lambda: None)
    sim = one_f_one_b()
    text = terminal.render(sim, build(sim), "t", width=120, colour=True)
    assert not ANSI.search(text) and "F0 F1 F2 F3" in text
