"""What `ppdsl simulate` and `ppdsl show` say: hand-offs counted, only the costs that apply,
a stuck schedule named as stuck with where each rank waits (no figures)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppdsl.cli import main
from ppdsl.profiles import profile_json

ROOT = Path(__file__).resolve().parents[2]
ONE_F_ONE_B = str(ROOT / "schedules" / "1f1b.pps")
# Rank 0 runs a backward before its forward: both ranks wait forever on 0F0.
STUCK = "pipeline ranks=2 microbatches=1\nrank 0: 0B0 0F0\nrank 1: 1F0 1B0\n"


def _row(out: str, name: str) -> list[str]:
    line = next(line for line in out.splitlines() if line.startswith(name))
    return line[len(name):].split()


def test_compare_counts_hand_offs_in_comm_time(capsys: pytest.CaptureFixture[str]) -> None:
    # 1F1B on 4 ranks x 8 microbatches: 3 forward and 3 backward hand-offs per microbatch.
    assert main(["simulate", ONE_F_ONE_B, ONE_F_ONE_B, "--costs", "F=1,B=2,comm=0.1"]) == 0
    out = capsys.readouterr().out
    assert _row(out, "comm time (sum)") == ["4.8", "4.8"]
    assert main(["simulate", ONE_F_ONE_B, "--costs", "F=1,B=2,comm=0.1"]) == 0
    assert "hand-offs: 48 messages between ranks with no send/recv in the file, 4.8 in flight" in capsys.readouterr().out


def test_explicit_messages_are_comm_not_hand_offs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lowered = tmp_path / "lowered.pps"
    assert main(["expand", ONE_F_ONE_B, "--comms", "-o", str(lowered)]) == 0
    assert main(["simulate", str(lowered), str(lowered), "--costs", "comm=0.1"]) == 0
    out = capsys.readouterr().out
    assert "hand-offs" not in out and float(_row(out, "comm time (sum)")[0]) > 4.8


def test_a_profile_prints_only_the_costs_that_apply(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    measured = [{"kind": kind, "stage": s, "duration": d + s / 10} for s in range(4) for kind, d in (("F", 1.5), ("B", 3))]
    profile = tmp_path / "profile.json"
    profile.write_text(profile_json({}, "ms", measured))
    assert main(["simulate", ONE_F_ONE_B, "--costs", str(profile)]) == 0
    costs = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("costs:"))
    assert costs == "costs: F_s0=1.5 B_s0=3 F_s1=1.6 B_s1=3.1 F_s2=1.7 B_s2=3.2 F_s3=1.8 B_s3=3.3 comm=0 (ms)"


def test_inline_costs_name_the_kinds_the_schedule_has(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", ONE_F_ONE_B, "--costs", "F=1,B=2,comm=0.1,F_s2=3"]) == 0
    assert "costs: F=1 B=2 F_s2=3 comm=0.1\n" in capsys.readouterr().out
    assert main(["simulate", str(ROOT / "schedules" / "dualpipev.pps"), "--costs", "F=1,B=2,overlap=0.5"]) == 0
    assert "costs: F=1 B=2 I=1 W=1 comm=0 overlap=0.5\n" in capsys.readouterr().out


@pytest.fixture
def stuck(tmp_path: Path) -> str:
    path = tmp_path / "stuck.pps"
    path.write_text(STUCK)
    return str(path)


def test_a_stuck_report_says_where_not_figures(stuck: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", stuck]) == 1
    out = capsys.readouterr().out
    assert "STUCK: the schedule cannot finish under rendezvous; 2 ranks wait forever:" in out
    assert "rank 0 waits at step 0 (0B0) for data `0F0` from rank 0" in out
    assert "rank 1 waits at step 0 (1F0) for data `0F0` from rank 0" in out
    assert "makespan" not in out and "bubble" not in out and "critical path" not in out


def test_a_stuck_column_has_no_figures(stuck: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", ONE_F_ONE_B, stuck]) == 1
    out = capsys.readouterr().out
    assert _row(out, "makespan") == ["33", "-"] and _row(out, "bubble") == ["27.3%", "-"]
    assert f"{stuck}: STUCK under rendezvous: rank 0 at 0B0 waits for `0F0` (rank 0); " \
           "rank 1 at 1F0 waits for `0F0` (rank 0)" in out


def test_a_stuck_picture_says_where_not_figures(stuck: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", stuck, "--no-color"]) == 1
    head = capsys.readouterr().out.splitlines()[0]
    assert head == ("stuck.pps: 2 ranks x 1 microbatch, rendezvous  STUCK under rendezvous: "
                    "rank 0 at 0B0 waits for `0F0` (rank 0); rank 1 at 1F0 waits for `0F0` (rank 0)")
    svg = tmp_path / "s.svg"
    assert main(["show", stuck, "--svg", str(svg)]) == 1
    drawn = svg.read_text()
    assert "STUCK under rendezvous: rank 0 at 0B0 waits for" in drawn and "bubble" not in drawn


def test_a_stuck_report_of_many_ranks_lists_some_and_counts_the_rest(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from ppdsl.cli.simulate_cmd import SHOWN_WAITS

    ranks = SHOWN_WAITS + 4
    path = tmp_path / "many.pps"
    path.write_text(f"pipeline ranks={ranks} microbatches=1\nrank 0: 0B0 0F0\n"
                    + "".join(f"rank {r}: {r}F0 {r}B0\n" for r in range(1, ranks)))
    assert main(["simulate", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{ranks} ranks wait forever:" in out and out.count(" waits at step ") == SHOWN_WAITS
    assert out.endswith("  ... and 4 more (`--format json` lists every wait)\n")


def _doc_block(command: str) -> list[str]:
    page = (ROOT / "docs" / "simulate.md").read_text(encoding="utf-8")
    block = next(b for b in page.split("```console\n")[1:] if b.startswith(f"$ {command}\n"))
    return block[:block.index("```")].splitlines()[1:]


@pytest.mark.parametrize("command", ["ppdsl simulate schedules/1f1b.pps --costs F=1,B=2", "ppdsl simulate stuck.pps"])
def test_simulate_md_shows_what_simulate_prints(command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "schedules").symlink_to(ROOT / "schedules")
    (tmp_path / "stuck.pps").write_text(STUCK)
    monkeypatch.chdir(tmp_path)
    main(command.split()[1:])
    printed = capsys.readouterr().out.splitlines()
    shown = _doc_block(command)
    assert len(shown) >= 5 and len(printed) >= len(shown)
    for line, expected in zip(printed, shown):
        if "..." not in expected:  # a line the page cuts short
            assert line == expected
