"""docs/search.md: its worked example is what the command prints and writes, its files lint."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import ROOT
from ppdsl.cli import main
from ppdsl.expansion import parse

PAGE = ROOT / "docs" / "search.md"
EXAMPLE = ROOT / "docs" / "examples" / "search_8x16_m7.pps"


def page() -> str:
    return PAGE.read_text(encoding="utf-8")


@pytest.mark.slow
def test_worked_example_is_what_search_prints_and_writes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    block = re.search(r"```console\n\$ (ppdsl search [^\n]*-o found\.pps)\n([^\n]*)\n```", page())
    assert block is not None
    argv = block.group(1).split()[1:]
    out = tmp_path / "found.pps"
    argv[argv.index("found.pps")] = str(out)
    assert main(argv) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == block.group(2).replace("found.pps", str(out))
    assert out.read_text() == EXAMPLE.read_text()  # deterministic: the shipped file is this run's
    head = re.search(r"```text\n(# found by.*?)```", page(), flags=re.S)
    assert head is not None and EXAMPLE.read_text().startswith(head.group(1))
    # the same command line in the README tour and docs/cli.md
    for doc in (ROOT / "README.md", ROOT / "docs" / "cli.md"):
        assert block.group(1) in doc.read_text(encoding="utf-8"), doc


def test_shipped_files_lint_clean_and_pictures_exist() -> None:
    assert main(["lint", str(EXAMPLE), str(ROOT / "docs" / "examples" / "v_half_8x16.pps")]) == 0
    for name in ("search_8x16_m7.svg", "v_half_8x16.svg"):
        svg = ROOT / "docs" / "img" / name
        assert svg.read_text().startswith("<svg") and name in page()


def test_pps_examples_parse() -> None:
    blocks = re.findall(r"^```pps\n(.*?)^```", page(), flags=re.S | re.M)
    assert blocks
    for text in blocks:
        program = parse(text)
        assert program.generated is not None and program.generated.name == "search"


@pytest.mark.slow
def test_memory_actions_example_is_what_search_prints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    block = re.search(r"```console\n\$ (ppdsl search [^\n]*--memory-actions recompute -o found\.pps)\n([^\n]*)\n```",
                      page())
    assert block is not None
    argv = block.group(1).split()[1:]
    out = tmp_path / "found.pps"
    argv[argv.index("found.pps")] = str(out)
    assert main(argv) == 0
    assert capsys.readouterr().out.strip() == block.group(2).replace("found.pps", str(out))
    assert "v_min with recompute placed to fit the limit" in out.read_text().splitlines()[0]
    without = [a for a in argv if a not in ("--memory-actions", "recompute")]
    assert main(without) == 0
    assert "makespan 83.5," in capsys.readouterr().out and "makespan 83.5" in page()
