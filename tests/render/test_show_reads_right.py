"""`ppdsl show` says what it draws: no silent plain text under --color, a long step does not
look like a short one and idle time, the footer describes the sends it left out, and the
pictures' labels name the stages where the stage tells steps apart."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from conftest import ROOT, SCHEDULES
from ppdsl import load_program, parse
from ppdsl.cli import main
from ppdsl.costs import CostModel
from ppdsl.lower import lower
from ppdsl.render import terminal
from ppdsl.render.svg import render_svg
from ppdsl.render.timeline import build
from ppdsl.simulate import simulate

LABEL = re.compile(r"<title>rank \d+ step \d+: ([^\n<]*)[^<]*</title>(?:<rect[^>]*>)+(?:<text[^>]*>([^<]*)</text>)?")


def _lanes(text: str) -> list[str]:
    return [line.split("|", 1)[1] for line in text.splitlines() if line.startswith("rank ")]


def test_color_without_rich_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("rich", "rich.console", "rich.text"):
        monkeypatch.setitem(sys.modules, name, None)  # what Python does for a module that is absent
    assert main(["show", str(SCHEDULES / "1f1b.pps"), "--color", "--width", "100"]) == 0
    out = capsys.readouterr()
    assert "\x1b[" not in out.out and "rank 3 |" in out.out
    assert out.err == ("ppdsl show: --color needs rich, which is not installed: pip install 'ppdsl[show]' "
                       "(drawing in plain text)\n")


def test_a_two_cell_step_is_filled_in_plain_text() -> None:
    sim = simulate(parse("pipeline ranks=4 microbatches=8\nuse 1f1b()\n"), CostModel((("F", 1.0), ("B", 2.0))))
    text = terminal.render(sim, build(sim), "t", width=200, colour=False)
    last = _lanes(text)[3]
    assert last.split() == [w for m in range(8) for w in (f"F{m}", f"B{m}---")]
    assert "; `-` continues the step before it" in text.splitlines()[-1]


def test_a_two_cell_step_is_a_coloured_block_in_colour() -> None:
    pytest.importorskip("rich")
    sim = simulate(parse("pipeline ranks=4 microbatches=8\nuse 1f1b()\n"), CostModel((("F", 1.0), ("B", 2.0))))
    assert "B0---" not in terminal.render(sim, build(sim), "t", width=200, colour=True)


def test_the_footer_counts_the_sends_it_leaves_out() -> None:
    program = lower(load_program(str(SCHEDULES / "1f1b.pps")))
    sim = simulate(program)  # the default costs
    timeline = build(sim)
    text = terminal.render(sim, timeline, "t", width=400, colour=False)
    comms = [s for s in timeline.slots if s.category in ("SEND", "RECV")]
    free = [s for s in comms if s.duration <= 0]
    assert 0 < len(free) < len(comms)  # some wait, so take time and are drawn
    assert any(re.search(r"\b[SR][FB]\d", lane) for lane in _lanes(text))
    assert (f"{len(free)} of the {len(comms)} sends/receives take no time under these costs and are not drawn "
            "(--costs comm=... gives them one)") in text.splitlines()
    # docs/simulate.md quotes this footer for `ppdsl expand --comms schedules/1f1b.pps` at the default costs.
    assert f"(`{len(free)} of the {len(comms)} sends/receives take no time ...`)" in (
        ROOT / "docs" / "simulate.md").read_text(encoding="utf-8").replace("\n  ", " ")
    priced = simulate(program, CostModel((("F", 1.0), ("B", 2.0), ("comm", 0.5))))
    assert "not drawn" not in terminal.render(priced, build(priced), "t", width=400, colour=False)


def test_overlapped_pairs_are_labelled_with_their_stages() -> None:
    sim = simulate(load_program(str(SCHEDULES / "dualpipev.pps")))
    labels = {step: label for step, label in LABEL.findall(render_svg(sim, build(sim), "t")) if step.startswith("(")}
    assert labels and all(label for label in labels.values())
    for step, label in labels.items():
        a, b = step.strip("()").split(";")
        assert label in (step, f"{a}+{b}"), (step, label)
    assert len(set(labels.values())) == len(labels)  # (0F7;7B3) and (7F7;0B3) read differently


@pytest.mark.parametrize("costs", [(), (("F", 1.0), ("B", 2.0), ("I", 1.0), ("W", 1.0), ("comm", 0.1))])
def test_zbv_at_the_default_width_has_a_label_on_every_step(costs: tuple[tuple[str, float], ...]) -> None:
    sim = simulate(load_program(str(SCHEDULES / "zbv.pps")), CostModel(costs))
    found = LABEL.findall(render_svg(sim, build(sim), "zbv.pps"))
    assert len(found) == sim.program.action_count
    assert all(label == step for step, label in found), [f for f in found if f[0] != f[1]][:3]


def test_the_terminal_unit_is_singular_for_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", str(SCHEDULES / "1f1b.pps"), "--no-color", "--width", "100"]) == 0
    assert "; 1 cell = 1 time unit" in capsys.readouterr().out
    assert main(["show", str(SCHEDULES / "1f1b.pps"), "--no-color", "--costs", "F=0.5", "--width", "100"]) == 0
    assert "; 1 cell = 0.5 time units" in capsys.readouterr().out
