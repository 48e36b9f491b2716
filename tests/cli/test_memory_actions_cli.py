"""The command line with `R`, `OFFLOAD` and `RELOAD`: convert refuses them to a CSV, lint
explains their codes."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppdsl.cli import main


def test_convert_names_the_action_a_csv_cannot_hold(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "r.pps"
    source.write_text("pipeline ranks=1 microbatches=1\nrank 0: 0F0 0R0 0B0\n", encoding="utf-8")
    assert main(["convert", str(source), str(tmp_path / "r.csv")]) == 1
    err = capsys.readouterr().err
    assert f"{source}:2:13: error[PPS031]: PyTorch's CSV has no `R` action: `0R0` cannot be written" in err
    assert not (tmp_path / "r.csv").exists()


@pytest.mark.parametrize("code", ["PPS109", "PPS110", "PPS111"])
def test_lint_explains_the_new_codes(code: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", "--explain", code]) == 0
    out = capsys.readouterr().out
    assert out.startswith(code) and "**Fix:**" in out and "memory_actions.py" in out


@pytest.mark.parametrize("code", ["PPS112", "PPS113"])
def test_lint_explains_the_sharding_codes(code: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", "--explain", code]) == 0
    out = capsys.readouterr().out
    assert out.startswith(code) and "**Fix:**" in out and "sharding.py" in out
