"""`ppdsl show` of a schedule too long for a screen: the overview, and the crop flags."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import ROOT
from ppdsl.cli import main

INTERLEAVED = "pipeline ranks=16 microbatches=128\nuse interleaved_1f1b(virtual=2)\n"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def big(tmp_path: Path) -> str:
    f = tmp_path / "big.pps"
    f.write_text(INTERLEAVED)
    return str(f)


def test_the_default_picture_fits_a_screen_and_says_how_to_see_more(big: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "show", big, "--no-color")
    lines = out.splitlines()
    assert code == 0
    assert len(lines) <= 50  # every step in pages is ~1,000 lines (--full)
    assert all(len(line) <= 120 for line in lines)
    lanes = [line for line in lines if line.startswith("rank ")]
    assert [line.split("|")[0].strip() for line in lanes] == [f"rank {r}" for r in range(16)]
    # Rank 0 starts with forwards and spends most of the run in backwards (B takes twice F).
    assert lanes[0].split("|")[1].startswith("FFFF") and lanes[0].count("B") > 80
    assert "--ranks" in lines[-1] and "--from" in lines[-1] and "--to" in lines[-1]
    assert run(capsys, "show", big, "--no-color", "--full")[1].count("\n") > 900


def test_lines_and_width_bound_the_overview(big: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "show", big, "--no-color", "--lines", "12", "--width", "60")
    lines = out.splitlines()
    assert code == 0 and len(lines) <= 12 and max(map(len, lines)) <= 60
    assert "ranks 5-15 not shown" in out  # 12 lines: 5 lanes and the frame, wrapped


def test_ranks_pick_lanes_in_order(big: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "show", big, "--no-color", "--ranks", "0,2,5-7")
    names = [line.split("|")[0].strip() for line in out.splitlines() if line.startswith("rank ")]
    assert code == 0 and names == ["rank 0", "rank 2", "rank 5", "rank 6", "rank 7"]
    code, out, _ = run(capsys, "show", big, "--no-color", "--ranks", "3")
    assert [line.split("|")[0].strip() for line in out.splitlines() if line.startswith("rank ")] == ["rank 3"]


def test_a_window_is_drawn_step_by_step(big: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "show", big, "--no-color", "--ranks", "0-1", "--from", "100", "--to", "110")
    lines = out.splitlines()
    assert code == 0 and len(lines) <= 50
    ruler = lines[1].split()
    assert ruler[0] == "100"  # the ruler counts from --from
    lane0 = next(line for line in lines if line.startswith("rank 0"))
    assert re.search(r"\b\d+[FB]\d+", lane0)  # steps themselves, not the overview's glyphs
    assert "overview" not in out


@pytest.mark.parametrize("argv, says", [
    (["--ranks", "16"], "rank 16 is not in the schedule"),
    (["--ranks", "3-1"], "no range of ranks"),
    (["--ranks", "a"], "expected ranks such as"),
    (["--from", "50", "--to", "50"], "is not after --from"),
    (["--from", "1e9"], "past the end"),
    (["--to", "-1"], "--to"),
])
def test_bad_crops_are_usage_errors(big: str, capsys: pytest.CaptureFixture[str], argv: list[str], says: str) -> None:
    code, _, err = run(capsys, "show", big, *argv)
    assert code == 2 and says in err and "internal error" not in err


def test_svg_and_html_are_well_formed_and_cropped(big: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    svg, page = tmp_path / "o.svg", tmp_path / "o.html"
    code, _, err = run(capsys, "show", big, "--ranks", "2-3", "--from", "100", "--to", "200",
                       "--svg", str(svg), "--html", str(page))
    assert code == 0, err
    root = ET.fromstring(svg.read_text())  # well-formed XML
    texts = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert [t for t in texts if t.startswith("rank ")] == ["rank 2", "rank 3"]
    assert "100" in texts  # the axis starts at --from
    tips = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert tips and all(t.startswith(("rank 2 ", "rank 3 ")) for t in tips)
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    ET.fromstring(html[html.index("<svg"):html.index("</svg>") + len("</svg>")])


def test_the_crop_examples_in_cli_md(big: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    from conftest import ROOT

    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    block = page[page.index("A cropped picture that fits the lines is drawn step by step:"):]
    block = block[block.index("```console\n") + len("```console\n"):block.index("```\n", block.index("```console"))]
    commands = [line[len("$ ppdsl "):].split() for line in block.splitlines()]
    assert len(commands) == 2
    monkeypatch.chdir(Path(big).parent)
    for argv in commands:
        code, out, err = run(capsys, *argv, "--no-color")
        assert code == 0, err
        assert len(out.splitlines()) <= 50
    assert (tmp_path / "part.svg").read_text().startswith("<svg")


def test_a_broken_schedule_keeps_to_the_lines_and_marks_the_stuck_steps(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "stuck.pps"
    f.write_text("pipeline ranks=2 microbatches=2\n"
                 "rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1\n"
                 "rank 1: 1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1\n")
    code, out, _ = run(capsys, "show", str(f), "--no-color", "--lines", "8")
    lanes = [line for line in out.splitlines() if line.startswith("rank ")]
    assert code == 1 and len(out.splitlines()) <= 8  # the full picture and its notes take 10
    assert len(lanes) == 2 and all("!" in lane for lane in lanes)


def test_one_rank_left_out_is_named_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "show", str(ROOT / "schedules" / "1f1b.pps"), "--no-color", "--lines", "8",
                       "--comm-model", "buffered", "--costs", "F=1,B=2,comm=0.1")
    assert code == 0 and "; rank 3 not shown" in out and "--ranks 0-2 " in out
