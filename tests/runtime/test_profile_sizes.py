"""A real `ppdsl run --profile` records each stage's sizes, predicts each rank's peak bytes from
them within 10% of what it measured, and its profile (a 4-stage ZB-V at 2 ranks) costs a
comparison of ZB-V and 1F1B at 4 ranks: both columns, carried over by share of layers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ppdsl.cli import main

ROOT = Path(__file__).resolve().parents[2]
paddle = pytest.importorskip("paddle")


@pytest.mark.slow
def test_a_zbv_profile_sizes_and_costs_another_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "zbv2.pps"
    file.write_text("pipeline ranks=2 microbatches=4\nuse zbv()\n")
    profile = tmp_path / "p.json"
    assert main(["run", str(file), "--steps", "3", "--timeout", "120", "-q", "--profile", str(profile),
                 "--optimizer", "adam"]) == 0
    capsys.readouterr()
    data = json.loads(profile.read_text())
    assert data["stages"] == 4
    assert all(len(data["sizes"][k]) == 4 and min(data["sizes"][k]) > 0 for k in ("activation", "kept", "state"))
    for m in data["memory"]:
        measured = m["peak_bytes"] + m["state_bytes"]
        assert abs(m["predicted_bytes"] - measured) <= 0.1 * measured, m
    zbv, one = str(ROOT / "schedules" / "zbv.pps"), str(ROOT / "schedules" / "1f1b.pps")
    assert main(["simulate", zbv, one, "--costs", str(profile)]) == 0
    out, err = capsys.readouterr()
    assert "has errors" not in out + err
    assert out.splitlines()[0].split() == [zbv, one]
    assert f"{zbv}: costs and sizes carried over from the profile's 4 stages to 8 stages, by share of layers" in out
    assert out.splitlines()[2].split()[1:] == ["yes", "yes"]
    assert any(line.startswith("peak bytes (max)") for line in out.splitlines())
