"""What the docs show the command line printing is what it prints, and the shipped picture is
what the tool draws now."""

from __future__ import annotations

import glob
import re
import shlex
from pathlib import Path

import pytest

from conftest import ROOT
from ppdsl.cli import main

DOCS = ROOT / "docs"


def _console(page: str, command: str) -> list[str]:
    """The lines a ```console block of `page` shows under `$ command`."""
    text = (DOCS / page).read_text(encoding="utf-8")
    m = re.search(rf"^\$ {re.escape(command)}\n(.*?)^```", text, flags=re.S | re.M)
    assert m, f"{page} has no `$ {command}` block"
    return m.group(1).splitlines()


def _run(command: str, cwd: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> list[str]:
    monkeypatch.chdir(cwd)
    argv = [arg for word in shlex.split(command)[1:] for arg in (sorted(glob.glob(word)) if "*" in word else [word])]
    main(argv)
    return capsys.readouterr().out.splitlines()


def test_cli_md_diagnostic_example(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    source = re.search(r"where `bad.pps` is\n\n```pps\n(.*?)^```", text, flags=re.S | re.M)
    assert source
    (tmp_path / "bad.pps").write_text(source.group(1))
    assert _run("ppdsl lint bad.pps", tmp_path, monkeypatch, capsys) == _console("cli.md", "ppdsl lint bad.pps")


@pytest.mark.parametrize("command", ["lint", "expand", "simulate", "convert", "fmt", "show"])
def test_problems_go_where_cli_md_says(command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    assert "by `ppdsl lint` on standard output" in text and "by every other command on standard\nerror" in text
    (tmp_path / "bad.pps").write_text("pipeline ranks=2 microbatches=2\nrank 0: 0F0 0X1\nrank 1: 1F0\n")
    monkeypatch.chdir(tmp_path)
    argv = [command, "bad.pps"] + (["out.csv"] if command == "convert" else [])
    assert main(argv) == 1
    out, err = capsys.readouterr()
    located = "bad.pps:2:13: error[PPS003]"
    if command == "lint":
        assert located in out and located not in err and "1 error and 0 warnings in 1 file" in err
    else:
        assert located in err and located not in out


def test_checks_md_example(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    command = "ppdsl lint schedules/*.pps tests/check/data/paddle_1f1b_2ranks.pps"
    assert _run(command, ROOT, monkeypatch, capsys) == _console("checks.md", command)


def test_the_shipped_zbv_picture_is_what_the_tool_draws_now(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (DOCS / "simulate.md").read_text(encoding="utf-8")
    m = re.search(r"^\$ (ppdsl show schedules/zbv\.pps .*--svg docs/img/zbv\.svg)$", text, flags=re.M)
    assert m, "docs/simulate.md does not say how docs/img/zbv.svg is made"
    argv = shlex.split(m.group(1))[1:]
    out = tmp_path / "zbv.svg"
    argv[argv.index("docs/img/zbv.svg")] = str(out)
    monkeypatch.chdir(ROOT)
    assert main(argv) == 0
    drawn = out.read_text(encoding="utf-8")
    shipped = (DOCS / "img" / "zbv.svg").read_text(encoding="utf-8")
    assert "makespan 26.8 " in drawn
    assert shipped == drawn, "docs/img/zbv.svg is stale: remake it with the command in docs/simulate.md"


def test_simulate_md_recompute_example(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    command = "ppdsl simulate recompute.pps"
    assert _run(command, DOCS / "examples", monkeypatch, capsys) == _console("simulate.md", command)


@pytest.mark.parametrize("command", ["ppdsl simulate offload.pps --costs OFFLOAD=0.5,RELOAD=0.5",
                                     "ppdsl simulate offload.pps --costs OFFLOAD=0.5,RELOAD=3",
                                     "ppdsl show offload.pps --costs OFFLOAD=0.5,RELOAD=0.5 --no-color",
                                     "ppdsl simulate sharded.pps --costs UNSHARD=3,REDUCE_GRAD=2",
                                     "ppdsl show sharded.pps --costs UNSHARD=3,REDUCE_GRAD=2 --no-color"])
def test_simulate_md_copy_lane_examples(command: str, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(command, DOCS / "examples", monkeypatch, capsys) == _console("simulate.md", command)
