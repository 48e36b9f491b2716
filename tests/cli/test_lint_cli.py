"""`ppdsl lint` and `ppdsl expand --comms`: exit codes, text and JSON output, the cap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ppdsl.cli import main

GOOD = "pipeline ranks=4 microbatches=8\nuse 1f1b()\n"
DEADLOCK = ("pipeline ranks=2 microbatches=2\n"
            "rank 0: 0F0 0SEND_F0 0F1 <0SEND_F1 0RECV_B0> 0B0 0RECV_B1 0B1\n"
            "rank 1: 1RECV_F0 1F0 1B0 <1SEND_B0 1RECV_F1> 1F1 1B1 1SEND_B1\n")


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_clean_file_exits_0_silently(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", write(tmp_path, "a.pps", GOOD)]) == 0
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_errors_exit_1_with_location(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "d.pps", DEADLOCK)
    assert main(["lint", path]) == 1
    out = capsys.readouterr().out
    assert f"{path}:2:26: error[PPS210]: deadlock under `rendezvous`: rank 0 waits at step 3 `0SEND_F1`" in out
    assert main(["lint", "--comm-model", "grouped", path]) == 0


def test_json_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "d.pps", DEADLOCK)
    assert main(["lint", "--format", "json", path, write(tmp_path, "a.pps", GOOD)]) == 1
    items = json.loads(capsys.readouterr().out)
    assert len(items) == 1
    for key in ("file", "line", "column", "code", "severity", "message", "rank", "step"):
        assert key in items[0]
    assert (items[0]["code"], items[0]["rank"], items[0]["step"], items[0]["severity"]) == ("PPS210", 0, 3, "error")


def test_warnings_exit_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", write(tmp_path, "w.pps", "pipeline ranks=1 microbatches=1\nrank 0: 0F0 0B0 _\n")]) == 0
    assert "warning[PPS403]" in capsys.readouterr().out


def test_syntax_errors_and_missing_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", write(tmp_path, "s.pps", "pipeline ranks=1 microbatches=1\nrank 0: 0Q0\n")]) == 1
    assert "PPS003" in capsys.readouterr().out
    assert main(["lint", str(tmp_path / "nope.pps"), write(tmp_path, "a.pps", GOOD)]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["lint"]) == 2


def test_cap_per_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = " ".join(f"0B{m}" for m in range(30)) + " " + " ".join(f"0F{m}" for m in range(30))
    path = write(tmp_path, "many.pps", f"pipeline ranks=1 microbatches=30\nrank 0: {rows}\n")
    assert main(["lint", "--max-errors", "5", path]) == 1
    out = capsys.readouterr().out
    assert out.count("error[PPS107]") == 5
    assert "... and 25 more diagnostics" in out


def test_max_memory_and_explain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "g.pps", "pipeline ranks=4 microbatches=8\nuse gpipe()\n")
    assert main(["lint", path]) == 0
    assert main(["lint", "--max-memory", "4", path]) == 1
    assert "PPS301" in capsys.readouterr().out
    assert main(["lint", "--explain", "PPS210"]) == 0
    assert "rendezvous" in capsys.readouterr().out
    assert main(["lint", "--explain", "PPS999"]) == 2


def test_expand_comms_and_fuse(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = write(tmp_path, "a.pps", "pipeline ranks=2 microbatches=3\nuse 1f1b()\n")
    out = str(tmp_path / "lowered.pps")
    assert main(["expand", "--comms", src, "-o", out]) == 0
    assert main(["lint", out]) == 0
    assert "0SEND_F0" in Path(out).read_text()
    fused = str(tmp_path / "fused.pps")
    assert main(["expand", "--comms", "--fuse", "--comm-model", "grouped", src, "-o", fused]) == 0
    assert "<0SEND_F1 0RECV_B0>" in Path(fused).read_text()
    assert main(["lint", "--comm-model", "grouped", fused]) == 0
    assert main(["expand", "--fuse", src]) == 2
    assert main(["expand", "--comms", out]) == 1
    assert "PPS220" in capsys.readouterr().err
