"""`R`, `OFFLOAD` and `RELOAD` across processes: `ppdsl run --verify` on programs whose
generators recompute and offload, both frameworks, 2 ranks on gloo."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppdsl.cli import main
from ppdsl.runtime.framework import installed


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["paddle", "torch"])
def test_recompute_and_offload_verify_across_processes(framework: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    if not installed(framework):
        pytest.skip(f"{framework} is not installed")
    files = []
    for i, call in enumerate(("1f1b(recompute=all)", "zbv(recompute=1)", "zb1p(offload=all)")):
        f = tmp_path / f"{i}_{call.split('(')[0]}.pps"
        f.write_text(f"pipeline ranks=2 microbatches=4\nuse {call}\n")
        files.append(str(f))
    code = main(["run", *files, "--framework", framework, "--steps", "2", "--verify", "--timeout", "60"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert out.count("verify ok: ") == 3, out

