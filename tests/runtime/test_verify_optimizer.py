"""`--verify` with a user's optimizer whose step makes a collective call: refused where it
happens, said on every rank, nothing left waiting."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppdsl.cli import main
from ppdsl.runtime.framework import installed


@pytest.mark.slow
def test_verify_refuses_an_optimizer_whose_step_makes_a_collective(capsys: pytest.CaptureFixture[str]) -> None:
    """Without --verify the optimizer trains; with it, rank 0's reference cannot join a
    collective: every rank stops at step 0 saying so, nothing hangs."""
    if not installed("torch"):
        pytest.skip("torch is not installed")
    root = Path(__file__).parents[2]
    optimizer = str(Path(__file__).parent / "helpers" / "collective_optimizer.py") + ":make"
    base = ["run", str(root / "schedules" / "1f1b.pps"), "--framework", "torch", "--optimizer", optimizer,
            "--steps", "2", "--timeout", "30"]
    assert main(base + ["-q"]) == 0
    capsys.readouterr()
    assert main(base + ["--verify"]) == 1
    out, err = capsys.readouterr()
    said = out + err
    assert "CollectiveRefused: --verify: the optimizer" in said and "calls all_reduce() in its step" in said, said
    assert "stopped because rank 0 raised at step 0" in said, said
