"""`ppdsl search --max-memory 40KB --costs profile.json`: a limit in bytes, by a profile's sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ppdsl.cli import main
from ppdsl.cost_sources import load_costs
from ppdsl.load import load_program
from ppdsl.memory import Sizes, peak_bytes
from ppdsl.search.byte_limit import ByteLimit
from ppdsl.search.problem import make_problem
from ppdsl.search.replay import peaks

# Two stages measured at 2 ranks: the last one heavier (a head), as in examples/gpt.
ACT, KEPT, STATE = [1000, 3000], [800, 2500], [10_000, 20_000]


def _profile(tmp_path: Path) -> str:
    actions = [{"rank": s, "stage": s, "kind": k, "duration": d * (1 + s)} for s in range(2)
               for k, d in (("F", 10), ("I", 10), ("W", 6))]
    data = {"ppdsl_profile": 1, "unit": "us", "stages": 2, "actions": actions,
            "sizes": {"activation": ACT, "kept": KEPT, "state": STATE}}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.slow
def test_the_found_schedule_fits_the_bytes_and_lint_agrees(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile, out = _profile(tmp_path), str(tmp_path / "best.pps")
    assert main(["search", "--ranks", "2", "--microbatches", "6", "--costs", profile, "--max-memory", "30KB",
                 "-o", out]) == 0
    line = capsys.readouterr().out
    assert "peak memory " in line and "(limit 29.3 KiB a rank, by the profile's sizes;" in line
    program = load_program(out)
    assert program.memory_limit is None  # the header's memory= counts the unit, not bytes
    found = peak_bytes(program, load_costs(profile, program.stages).sizes or Sizes([], [], []))
    assert max(found.peak) <= 30_000
    assert main(["lint", out, "--costs", profile, "--max-memory", "30KB"]) == 0
    # The limit bites: a rank of the heavy stage holds more than one microbatch under a looser one.
    assert main(["lint", out, "--costs", profile, "--max-memory", f"{int(max(found.peak)) - 1}B"]) == 1


@pytest.mark.slow
def test_json_reports_bytes_per_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "--ranks", "2", "--microbatches", "4", "--costs", _profile(tmp_path), "--max-memory",
                 "40KB", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["limit"] == 40_000 and data["limit_unit"] == "bytes"
    assert len(data["peak_bytes"]) == 2 and max(data["peak_bytes"]) <= 40_000
    assert data["state_bytes"][1] >= 20_000 / 2  # rank 1 holds the heavier state in either shape
    assert "pipeline ranks=2" in data["schedule"] and "memory=" not in data["schedule"]


@pytest.mark.slow
def test_too_small_says_the_smallest_in_bytes_and_that_one_works(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    profile = _profile(tmp_path)
    assert main(["search", "--ranks", "2", "--microbatches", "4", "--costs", profile, "--max-memory", "20KB",
                 "--stages-per-rank", "1"]) == 1
    err = capsys.readouterr().err
    # The loop's rank 1: its stage's state and one microbatch of its activations.
    assert "the smallest feasible limit is 22.5 KiB a rank" in err
    # A V (asked for: a profile of 2 stages searches only the loop by itself) spreads the heavy
    # stage's state over both ranks: 15,000 each, and 500 + 1500 of activations.
    assert main(["search", "--ranks", "2", "--microbatches", "4", "--costs", profile, "--max-memory", "16KB",
                 "--stages-per-rank", "2"]) == 1
    assert "the smallest feasible limit is 16.6 KiB a rank" in capsys.readouterr().err
    # Left to choose, it keeps to the shape the profile measured, and says so.
    assert main(["search", "--ranks", "2", "--microbatches", "4", "--costs", profile, "--max-memory", "16KB"]) == 1
    err = capsys.readouterr().err
    assert "V (2 stages a rank) schedules are not searched" in err
    assert "the smallest feasible limit is 22.5 KiB a rank" in err
    smallest = ByteLimit(20_000, load_costs(profile, 4).sizes or Sizes([], [], [])).smallest(2, 1)
    assert smallest == STATE[1] + ACT[1]
    assert main(["search", "--ranks", "2", "--microbatches", "4", "--costs", profile, "--max-memory",
                 f"{smallest:.0f}B", "--stages-per-rank", "1", "-o", str(tmp_path / "tight.pps")]) == 0


def test_bytes_without_sizes_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "--ranks", "2", "--microbatches", "4", "--max-memory", "3GiB"]) == 2
    assert "is in bytes, and no profile with sizes is given" in capsys.readouterr().err
    assert main(["search", "--ranks", "2", "--microbatches", "4", "--max-memory", "3XB"]) == 2
    assert "unknown unit `XB`" in capsys.readouterr().err


def test_the_weights_count_bytes_over_each_ranks_room() -> None:
    limit = ByteLimit(30_000, Sizes(ACT, KEPT, STATE))
    weights = limit.weights(2, 1)
    assert weights == (1000 / 20_000, 3000 / 10_000)
    problem = make_problem(2, 4, 1, 1.0, weights=weights)
    # 1F1B's warm-up at 2 ranks: rank 0 holds 2 forwards, rank 1 one: 2 x 1000 of 20,000, 3000 of 10,000.
    rows = [[0, 3, 1, 2, 6, 4, 5, 9, 7, 8, 10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]]
    assert peaks(problem, rows) == pytest.approx([0.1, 0.3])
