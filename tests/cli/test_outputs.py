"""What commands write, and what they refuse to write: permissions and symlinks kept, outputs
checked against the inputs and each other before any work, options that do not apply refused."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ppdsl.cli import main
from ppdsl.cli.fmt_cmd import NO_NEWLINE

UGLY = "pipeline  ranks=1   microbatches=2\nrank 0:   0F0 0F1 0B0 0B1\n"
ONE = "pipeline ranks=1 microbatches=2\nrank 0: 0F0 0F1 0B0 0B1\n"


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("bits", [0o600, 0o755, 0o640])
def test_fmt_keeps_the_files_permissions(tmp_path: Path, bits: int) -> None:
    f = tmp_path / "m.pps"
    f.write_text(UGLY)
    f.chmod(bits)
    assert main(["fmt", str(f)]) == 0
    assert f.read_text() == ONE and mode(f) == bits


def test_fmt_writes_through_a_symlink(tmp_path: Path) -> None:
    target = tmp_path / "real.pps"
    target.write_text(UGLY)
    link = tmp_path / "link.pps"
    link.symlink_to(target.name)
    assert main(["fmt", str(link)]) == 0
    assert link.is_symlink() and target.read_text() == ONE


def test_convert_over_an_existing_csv_keeps_its_mode_and_link(tmp_path: Path) -> None:
    src = tmp_path / "one.pps"
    src.write_text(ONE)
    target = tmp_path / "target.csv"
    target.write_text("old\n")
    target.chmod(0o600)
    link = tmp_path / "out.csv"
    link.symlink_to(target.name)
    assert main(["convert", str(src), str(link)]) == 0
    assert link.is_symlink() and target.read_text().startswith("0F0,0F1") and mode(target) == 0o600


def test_fmt_diff_marks_a_last_line_without_newline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "n.pps"
    f.write_text("pipeline ranks=1 microbatches=1\nrank 0:  0F0 0B0")
    assert main(["fmt", "--diff", str(f)]) == 1
    lines = capsys.readouterr().out.splitlines(True)
    assert "-rank 0:  0F0 0B0\n" in lines and "+rank 0: 0F0 0B0\n" in lines
    assert lines[lines.index("-rank 0:  0F0 0B0\n") + 1] == NO_NEWLINE
    assert all(line.endswith("\n") for line in lines)


@pytest.mark.parametrize("argv", [
    ["expand", "{src}", "-o", "{tmp}/ex.csv"],
    ["search", "--ranks", "2", "--microbatches", "2", "--max-memory", "2", "-o", "{tmp}/found.CSV"],
    ["convert", "{src}", "{tmp}/x.csv", "--to", "pps"],
    ["convert", "{src}", "{tmp}/x.pps", "--to", "csv"],
    ["convert", "{src}", "{tmp}/x.pps", "--dialect", "legacy"],
    ["convert", "{src}", "{tmp}/x.pps", "--write-dialect", "legacy"],
    ["expand", "--comm-model", "grouped", "{src}"],
    ["expand", "--comms", "--comm-model", "grouped", "{src}"],
    ["show", "{src}", "--svg", "{tmp}/same", "--html", "{tmp}/same"],
    ["show", "{src}", "--svg", "{tmp}/a.svg", "--trace", "{tmp}/./a.svg"],
])
def test_outputs_that_cannot_be_right_are_usage_errors(tmp_path: Path, argv: list[str],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "one.pps"
    src.write_text(ONE)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main([a.format(src=src, tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_convert_reads_a_csv_from_standard_input_when_a_dialect_says_so(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"0F0,0B0\n")))
    assert main(["convert", "-", "-", "--to", "pps", "--dialect", "current"]) == 0
    assert "rank 0: 0F0 0B0" in capsys.readouterr().out


@pytest.mark.parametrize("extra", [
    ["--profile", "{file}"],            # the profile over the schedule it runs
    ["--profile", "{tmp}"],             # a directory
    ["--profile", "{tmp}/no/p.json"],   # in a directory that does not exist
    ["--logs", "{file}"],               # a file, not a directory
])
def test_run_refuses_outputs_before_any_process(tmp_path: Path, extra: list[str],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "two.pps"
    f.write_text("pipeline ranks=2 microbatches=2\nuse 1f1b()\n")
    text = f.read_text()
    assert main(["run", str(f), "--steps", "1", *[a.format(file=f, tmp=tmp_path) for a in extra]]) == 2
    out, err = capsys.readouterr()
    assert "ppdsl run: error:" in err and "Traceback" not in err
    assert out == ""  # not even the line a run prints as it starts its ranks
    assert f.read_text() == text


def test_a_files_search_past_its_size_is_refused_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "big.pps"
    f.write_text("pipeline ranks=32 microbatches=256\nuse search(max_memory=6)\n")
    assert main(["lint", str(f)]) == 1
    out = capsys.readouterr().out
    assert f"{f}:2:5: error[PPS015]" in out and "ppdsl search --ranks 32 --microbatches 256 --max-memory 6 -o" in out


@pytest.mark.parametrize("text, needs, needed", [
    ("pipeline ranks=1 microbatches=1 stages=2 placement=[0,0]\nrank 0: 0F0 (1F0;1B0) 0B0\n", "1B0", "1F0"),
    ("pipeline ranks=1 microbatches=1\nrank 0: (0F0;0B0)\n", "0B0", "0F0"),
])
def test_a_pair_whose_action_needs_the_other_is_told_as_such(tmp_path: Path, text: str, needs: str, needed: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "pair.pps"
    f.write_text(text)
    assert main(["lint", str(f)]) == 1
    out = capsys.readouterr().out
    assert "error[PPS108]" in out and f"`{needs}` needs `{needed}`, which runs beside it" in out
    assert "PPS210" not in out and f"take the pair apart: `{needed}` first, then `{needs}`" in out


def test_model_specs_say_what_is_wrong(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ppdsl.diagnostics import UsageError
    from ppdsl.runtime.jobs.models import resolve

    (tmp_path / "notcall.py").write_text("build_stage = 3\n")
    (tmp_path / "folder").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match="its `build_stage` is int, not a function"):
        resolve("notcall.py", None, None)
    with pytest.raises(UsageError, match="is a folder with no model.py in it"):
        resolve("folder", None, None)


def test_a_model_for_the_other_framework_is_refused_before_the_ranks_start() -> None:
    from conftest import ROOT
    from ppdsl.diagnostics import UsageError
    from ppdsl.runtime.jobs.models import check_contract

    model = str(ROOT / "examples" / "torch" / "my_model.py")
    with pytest.raises(UsageError, match="the module imports torch, not paddle: run it with --framework torch"):
        check_contract(model, None, None, "sgd", [2], "paddle")
    assert check_contract(model, None, None, "sgd", [2], "torch")[0] == model + ":build_stage"
