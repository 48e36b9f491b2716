"""`R` across processes: `ppdsl run --verify` on programs whose generators recompute, both
frameworks, 2 ranks on gloo."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppdsl.cli import main
from ppdsl.runtime.framework import installed


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["paddle", "torch"])
def test_recompute_verifies_across_processes(framework: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    if not installed(framework):
        pytest.skip(f"{framework} is not installed")
    files = []
    for call in ("1f1b(recompute=all)", "zbv(recompute=1)"):
        f = tmp_path / f"{call.split('(')[0]}.pps"
        f.write_text(f"pipeline ranks=2 microbatches=4\nuse {call}\n")
        files.append(str(f))
    code = main(["run", *files, "--framework", framework, "--steps", "2", "--verify", "--timeout", "60"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert out.count("verify ok: ") == 2, out
