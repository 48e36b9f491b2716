"""A subcommand's run imports only what it needs: the others' modules cost start-up on every call."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

SCRIPT = r"""
import sys
from ppdsl.cli import main
code = main(sys.argv[1:])
print(code, " ".join(sorted(m for m in sys.modules if m.startswith(("ppdsl.", "lark")))))
"""


def _imported(tmp_path: Path, *argv: str) -> tuple[int, set[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", SCRIPT, *argv], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    code, _, modules = r.stdout.strip().splitlines()[-1].partition(" ")  # (after any help text)
    return int(code), set(modules.split())


def test_lint_of_a_csv_imports_neither_the_other_commands_nor_lark(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("0F0,0B0\n")
    code, modules = _imported(tmp_path, "lint", "a.csv")
    assert code == 0
    assert "ppdsl.cli.lint_cmd" in modules
    assert not {"ppdsl.cli.search_cmd", "ppdsl.cli.simulate_cmd", "ppdsl.search.driver", "lark"} & modules


def test_help_still_lists_every_command(tmp_path: Path) -> None:
    code, modules = _imported(tmp_path, "--help")
    assert code == 0
    assert "search" in subprocess.run([sys.executable, "-m", "ppdsl", "--help"], capture_output=True, text=True,
                                      timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    assert {"ppdsl.cli.lint_cmd", "ppdsl.cli.search_cmd", "ppdsl.cli.simulate_cmd"} <= modules


def test_a_pps_file_imports_the_search_only_when_it_uses_it(tmp_path: Path) -> None:
    # ppdsl/expansion.py lists the search with the generators; its driver waits for a `use search`.
    (tmp_path / "a.pps").write_text("pipeline ranks=2 microbatches=2\nuse 1f1b()\n")
    (tmp_path / "b.pps").write_text("pipeline ranks=2 microbatches=2\nuse search(max_memory=2)\n")
    code, modules = _imported(tmp_path, "expand", "a.pps")
    assert code == 0 and "ppdsl.expansion" in modules and "ppdsl.search.driver" not in modules
    code, modules = _imported(tmp_path, "expand", "b.pps")
    assert code == 0 and "ppdsl.search.driver" in modules
