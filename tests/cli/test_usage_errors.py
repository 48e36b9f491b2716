"""Bad flags and bad output paths: a usage error (exit 2) with the subcommand's own usage line,
and nothing written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import SCHEDULES
from ppdsl.cli import main

DEADLOCK = "pipeline ranks=2 microbatches=1\nrank 0: 0RECV_B0 0F0 0SEND_F0 0B0\nrank 1: 1RECV_F0 1F0 1B0 1SEND_B0\n"


@pytest.mark.parametrize("argv, complaint", [
    (["lint", "--max-errors", "-1"], "argument --max-errors: must be at least 0, not -1"),
    (["lint", "--max-errors", "two"], "argument --max-errors: expected a whole number, not `two`"),
    (["lint", "--max-memory", "nan"], "argument --max-memory: must be a finite number (microbatches of a rank's "
                                      "activations) or bytes such as 6GiB or 1.5GB, not `nan`"),
    (["lint", "--max-memory", "four"], "argument --max-memory: expected a number (microbatches of a rank's "
                                       "activations) or bytes such as 6GiB or 1.5GB, not `four`"),
    (["lint", "--max-memory", "-3"], "argument --max-memory: must be more than 0, not `-3`"),
    (["lint", "--max-memory=-1GiB"], "argument --max-memory: must be more than 0, not `-1GiB`"),
    (["lint", "--max-memory", "1.5XB"], "argument --max-memory: unknown unit `XB` in `1.5XB`: use B, KB, MB, GB, TB, "
                                        "PB, KiB, MiB, GiB, TiB, PiB"),
    (["lint", "--max-memory", "1e300GiB"], "argument --max-memory: `1e300GiB` is more than 888 PiB"),
    (["show", "--width", "5"], "argument --width: must be at least 20, not 5"),
    (["lint", "--bogus"], "unrecognized arguments: --bogus"),
    (["simulate", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_flag_values_are_usage_errors_of_the_subcommand(tmp_path: Path, argv: list[str], complaint: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dead.pps"
    path.write_text(DEADLOCK)
    assert main([*argv, str(path)]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.startswith(f"usage: ppdsl {argv[0]} ")
    assert out.err.rstrip().endswith(f"ppdsl {argv[0]}: error: {complaint}")


def test_a_negative_max_errors_no_longer_hides_the_deadlock(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dead.pps"
    path.write_text(DEADLOCK)
    assert main(["lint", "--max-errors", "0", str(path)]) == 1
    assert "error[PPS210]" in capsys.readouterr().out


def test_an_unknown_top_level_option_keeps_the_top_level_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--bogus"]) == 2
    assert capsys.readouterr().err.startswith("usage: ppdsl [-h]")


def _links(tmp_path: Path, name: str) -> list[str]:
    source = tmp_path / name
    (tmp_path / "sub").mkdir()
    os.symlink(source, tmp_path / f"link{source.suffix}")
    os.link(source, tmp_path / f"hard{source.suffix}")
    return [str(source), str(tmp_path / "sub" / ".." / name), str(tmp_path / f"link{source.suffix}"),
            str(tmp_path / f"hard{source.suffix}")]


@pytest.mark.parametrize("name", ["mine.pps", "mine.csv"])
def test_convert_refuses_to_write_over_its_input(tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    original = "# mine, with comments\npipeline ranks=2 microbatches=2\nrank 0: 0F{0..1} 0B{0..1}\nrank 1: [1F{0..1} 1B{0..1}]\n"
    if name.endswith(".csv"):
        assert main(["convert", str(_write(tmp_path / "src.pps", original)), str(tmp_path / name)]) == 0
        original = (tmp_path / name).read_text()
    else:
        _write(tmp_path / name, original)
    capsys.readouterr()
    for out in _links(tmp_path, name):
        assert main(["convert", str(tmp_path / name), out]) == 2
        assert "refusing to overwrite it" in capsys.readouterr().err
        assert (tmp_path / name).read_text() == original
    other = tmp_path / ("other.pps" if name.endswith(".csv") else "other.csv")
    assert main(["convert", str(tmp_path / name), str(other)]) == 0 and other.exists()


def test_expand_refuses_to_write_over_its_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = _write(tmp_path / "mine.pps", (SCHEDULES / "1f1b.pps").read_text())
    assert main(["expand", str(source), "-o", str(source)]) == 2
    assert "refusing to overwrite it" in capsys.readouterr().err
    assert source.read_text() == (SCHEDULES / "1f1b.pps").read_text()
    assert main(["expand", str(source), "-o", str(tmp_path / "other.pps")]) == 0


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_fmt_says_it_formats_pps_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv = _write(tmp_path / "f.csv", "0F0,0B0\n")
    assert main(["fmt", str(csv)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ppdsl fmt: error: {csv}: fmt formats .pps files; ")
    assert f"ppdsl convert {csv} {tmp_path / 'f.pps'}" in err
    assert csv.read_text() == "0F0,0B0\n"


@pytest.mark.parametrize("flag, name, complaint", [
    ("--svg", "out.png", "--svg out.png: writes SVG, not png: name the file out.svg"),
    ("--html", "out.svg", "--html out.svg: writes HTML, not svg: name the file out.html"),
    ("--trace", "out.svg", "--trace out.svg: writes Chrome trace JSON, not svg: name the file out.json"),
])
def test_show_refuses_a_picture_name_of_another_format(tmp_path: Path, flag: str, name: str, complaint: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / name
    assert main(["show", str(SCHEDULES / "1f1b.pps"), flag, str(out)]) == 2
    assert capsys.readouterr().err == f"ppdsl show: error: {flag} {out}: " + complaint.split(": ", 1)[1].replace(
        "name the file out", f"name the file {tmp_path}/out") + "\n"
    assert not out.exists()


@pytest.mark.parametrize("name", ["out.svg", "OUT.SVG", "picture"])
def test_show_writes_svg_under_a_matching_or_plain_name(tmp_path: Path, name: str) -> None:
    assert main(["show", str(SCHEDULES / "1f1b.pps"), "--svg", str(tmp_path / name)]) == 0
    assert (tmp_path / name).read_text().startswith("<svg")


@pytest.mark.parametrize("argv", [
    ["simulate", "{pps}", "-o", "{pps}"],
    ["simulate", "{pps}", "--costs", "{json}", "-o", "{json}"],
    ["show", "{pps}", "--trace", "{json}", "--costs", "{json}"],
])
def test_reports_and_pictures_are_not_written_over_an_input(tmp_path: Path, argv: list[str],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    pps = _write(tmp_path / "mine.pps", (SCHEDULES / "1f1b.pps").read_text())
    profile = _write(tmp_path / "p.json", '{"ppdsl_profile": 1, "costs": {"F": 1}}\n')
    before = pps.read_text(), profile.read_text()
    assert main([a.format(pps=pps, json=profile) for a in argv]) == 2
    assert "refusing to overwrite it" in capsys.readouterr().err
    assert (pps.read_text(), profile.read_text()) == before
