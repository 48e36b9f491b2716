"""docs/search.md "From a profile to a schedule": its three commands run as written (fewer
steps), the search prints the documented line, and the found file fits the byte limit."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

pytest.importorskip("paddle")
SECTION = (ROOT / "docs" / "search.md").read_text(encoding="utf-8").split("## From a profile to a schedule")[1]
NUMBER = r"\d+(?:\.\d+)?(?:e[+-]\d+)?"


def _ppdsl(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ppdsl", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def _shape(line: str) -> re.Pattern[str]:
    """The documented line with its figures, the generator's name and the path left open."""
    text = re.sub(r"generator [\w-]+:", "generator \0:", line).replace("wrote best.pps", "wrote \1")
    text = re.sub(r"not proven optimal \(lower bound [^)]*\)", "\3", text)
    text = re.sub(r"\d+(?:\.\d+)?(?:e[+-]\d+)?", "\2", text)
    pattern = re.escape(text).replace("\0", r"[\w-]+").replace("\1", r"\S*best\.pps").replace("\2", NUMBER)
    pattern = pattern.replace("\3", r"(?:not proven optimal \(lower bound|proven optimal \(meets the lower bound) "
                              + NUMBER + r"\)")
    return re.compile(pattern)


@pytest.mark.slow
def test_the_loop_runs_as_documented(tmp_path: Path) -> None:
    block = re.search(r"```sh\n(.*?)```", SECTION, flags=re.S)
    assert block is not None
    commands = [line.split()[1:] for line in block.group(1).strip().splitlines()]
    assert [c[0] for c in commands] == ["run", "search", "run"]
    start = tmp_path / "start.pps"
    start.write_text("pipeline ranks=2 microbatches=8\nuse zb1p()\n")
    names = {"start.pps": str(start), "p.json": str(tmp_path / "p.json"), "best.pps": str(tmp_path / "best.pps")}
    for argv in commands:
        argv[:] = [names.get(a, a) for a in argv]
        if "--steps" in argv:
            argv[argv.index("--steps") + 1] = "2"
    profiled = _ppdsl(commands[0])
    assert profiled.returncode == 0, profiled.stderr
    assert "ppdsl run: wrote" in profiled.stdout
    found = _ppdsl(commands[1])
    assert found.returncode == 0, found.stderr
    printed = re.search(r"```text\n(makespan [^\n]*)\n```", SECTION)
    assert printed is not None
    assert _shape(printed.group(1)).fullmatch(found.stdout.strip()), found.stdout
    limit = commands[1][commands[1].index("--max-memory") + 1]
    linted = _ppdsl(["lint", names["best.pps"], "--costs", names["p.json"], "--max-memory", limit])
    assert linted.returncode == 0, linted.stdout
    shown = _ppdsl(["show", names["best.pps"], "--costs", names["p.json"], "--no-color"])
    assert shown.stdout.splitlines()[-1].startswith("peak memory: rank 0 "), shown.stdout
    trained = _ppdsl(commands[2])
    assert trained.returncode == 0, trained.stderr
    assert re.search(r"2 steps, loss \S+ -> \S+", trained.stdout)
