"""`ppdsl run --profile` of a schedule that recomputes or offloads, on both frameworks' GPT:
the profile measures what `R`, `OFFLOAD` and `RELOAD` cost (time, bytes moved), what a forward
keeps beside its saved tensors, and the peak bytes it predicts from those sizes are within 10%
of what each rank measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ppdsl.cli import main

ROOT = Path(__file__).resolve().parents[2]
MODELS = {"paddle": ROOT / "examples" / "gpt" / "model.py", "torch": ROOT / "examples" / "torch" / "gpt" / "model.py"}


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["paddle", "torch"])
@pytest.mark.parametrize("memory", ["recompute=all", "offload=all"])
def test_a_profile_measures_the_memory_actions(framework: str, memory: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip(framework)
    model = MODELS[framework]
    file = tmp_path / "g.pps"
    file.write_text(f"pipeline ranks=2 microbatches=4\nuse 1f1b({memory})\n")
    profile = tmp_path / "p.json"
    assert main(["run", str(file), "--steps", "3", "--timeout", "120", "-q", "--profile", str(profile),
                 "--model", f"{model}:build_stage", "--data", f"{model}:batches", "--loss", f"{model}:loss"]) == 0
    capsys.readouterr()
    data = json.loads(profile.read_text())
    kinds = {a["kind"] for a in data["actions"] if a["duration"] > 0}
    sizes = data["sizes"]
    # What a forward keeps beside its saved tensors (input and output): a small part of it.
    assert all(0 < held < act / 4 for held, act in zip(sizes["input"], sizes["activation"])), sizes
    if memory.startswith("recompute"):
        assert "R" in kinds
    else:
        assert {"OFFLOAD", "RELOAD"} <= kinds
        assert data["costs"] == {"copy_lane": 0.0}  # the interpreter runs its copies itself
        for m in data["memory"]:
            [(stage, moved)] = m["offloaded_bytes"].items()
            assert sizes["activation"][int(stage)] / 2 < moved <= sizes["activation"][int(stage)], m
    for m in data["memory"]:
        assert m["peak_microbatches"] == m["predicted_microbatches"] == 1, m
        predicted = m["predicted_bytes"] - m["state_bytes"]
        assert abs(predicted - m["peak_bytes"]) <= 0.1 * m["peak_bytes"], m
    assert main(["simulate", str(file), "--costs", str(profile)]) == 0
    out = capsys.readouterr().out
    assert ("copy_lane=0" in out) == memory.startswith("offload")
