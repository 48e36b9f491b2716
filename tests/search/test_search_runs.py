"""A found schedule trains with Paddle and matches the unpipelined model (`ppdsl run --verify`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ppdsl.cli import main

paddle = pytest.importorskip("paddle")


@pytest.mark.slow
@pytest.mark.parametrize("ranks,limit", [(2, 1.5), (4, 2)])
def test_found_schedule_runs_and_verifies(ranks: int, limit: float, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    found = tmp_path / f"found_{ranks}.pps"
    assert main(["search", "--ranks", str(ranks), "--microbatches", "4", "--max-memory", str(limit),
                 "--costs", "comm=0.05", "-o", str(found)]) == 0
    capsys.readouterr()
    code = main(["run", str(found), "--steps", "2", "--verify", "-q", "--timeout", "60"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert re.search(rf"{re.escape(str(found))}: \d+ steps, .*verify ok", out), out
