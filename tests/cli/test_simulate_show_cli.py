"""`ppdsl simulate` and `ppdsl show` end to end, through `ppdsl.cli.main`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ppdsl.cli import main

ONE = "pipeline ranks=4 microbatches=8\nuse 1f1b()\n"
STUCK = ("pipeline ranks=2 microbatches=2\n"
         "rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1\n"
         "rank 1: 1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1\n")


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    out = {}
    for name, text in {"1f1b": ONE, "gpipe": ONE.replace("1f1b", "gpipe"), "stuck": STUCK,
                       "badcost": "pipeline ranks=2 microbatches=2\ncosts F=1 G=2\nuse 1f1b()\n"}.items():
        p = tmp_path / f"{name}.pps"
        p.write_text(text)
        out[name] = str(p)
    return out


def test_simulate_json(files: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", files["1f1b"], "--costs", "F=1,B=2,comm=0.1", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ranks"] == 4 and data["peak_memory"] == [4, 3, 2, 1]
    assert data["makespan"] == pytest.approx(34.6) and 0.3 < data["bubble_ratio"] < 0.31
    assert data["costs"]["comm"] == 0.1 and data["critical_path"][0]["action"] == "0F0"


def test_simulate_text_and_compare(files: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", files["1f1b"]]) == 0
    out = capsys.readouterr().out
    assert "makespan: 33" in out and "27.3%" in out and "critical path: 22 steps" in out
    assert main(["simulate", files["gpipe"], files["1f1b"]]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("peak memory (max)"))
    assert row.split()[-2:] == ["8", "4"]


def test_simulate_stuck_exits_1_with_the_cycle(files: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", files["stuck"]]) == 1
    captured = capsys.readouterr()
    assert "rank 0" in captured.err and "rank 1" in captured.err and "STUCK" in captured.out
    assert main(["simulate", files["stuck"], "--comm-model", "buffered"]) == 0


def test_simulate_bad_costs(files: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", files["badcost"]]) == 1
    assert "badcost.pps:2:11: error[PPS350]" in capsys.readouterr().err
    assert main(["simulate", files["1f1b"], "--costs", "F=-"]) == 2
    assert main(["simulate", files["1f1b"], "--costs", "missing.json"]) == 2


def test_show_terminal_and_files(files: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", files["1f1b"], "--width", "120", "--no-color"]) == 0
    out = capsys.readouterr().out
    assert out.count("rank ") >= 4 and "\x1b[" not in out
    paths = [tmp_path / n for n in ("t.json", "t.svg", "t.html")]
    assert main(["show", files["1f1b"], "--trace", str(paths[0]), "--svg", str(paths[1]), "--html", str(paths[2])]) == 0
    assert json.loads(paths[0].read_text())["traceEvents"]
    assert paths[1].read_text().startswith("<svg") and "<svg" in paths[2].read_text()


def test_show_draws_a_broken_schedule(files: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    svg = tmp_path / "s.svg"
    assert main(["show", files["stuck"], "--svg", str(svg)]) == 1
    assert "STUCK" in svg.read_text()
    assert "error[" in capsys.readouterr().err


def test_a_profile_with_measured_messages_simulates_the_file_as_the_runtime_runs_it(
        files: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from ppdsl.profiles import profile_json

    def profile(name: str, kinds: tuple[str, ...]) -> str:
        p = tmp_path / name
        p.write_text(profile_json({}, unit="us", actions=[
            {"kind": k, "stage": s, "microbatch": 0, "duration": 10.0 if k in "FBIW" else 30.0}
            for s in range(4) for k in kinds]))
        return str(p)

    measured, compute_only = profile("m.json", ("F", "B", "SEND_F")), profile("c.json", ("F", "B"))
    assert main(["simulate", files["1f1b"], "--costs", measured, "--format", "json"]) == 0
    lowered = json.loads(capsys.readouterr().out)
    assert main(["expand", "--comms", files["1f1b"], "-o", str(tmp_path / "low.pps")]) == 0
    assert main(["simulate", str(tmp_path / "low.pps"), "--costs", measured, "--format", "json"]) == 0
    explicit = json.loads(capsys.readouterr().out)
    # Sends and receives take measured time on both ranks: the simulation is the lowered file's.
    assert lowered["makespan"] == explicit["makespan"] and sum(lowered["comm"]) > 0
    assert main(["simulate", files["1f1b"], "--costs", measured]) == 0
    assert "lowered to explicit send/recv" in capsys.readouterr().out
    assert main(["simulate", files["1f1b"], "--costs", compute_only]) == 0  # no messages measured
    assert "lowered" not in capsys.readouterr().out
