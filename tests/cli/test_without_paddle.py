"""Parsing, formatting, expanding, converting, simulating and linting never import paddle or torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

# Runs in a fresh interpreter where any attempt to import paddle fails loudly.
SCRIPT = r"""
import sys

class BlockPaddle:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("paddle", "torch"):
            raise ImportError("paddle and torch are blocked in this test: " + name)
        return None

sys.meta_path.insert(0, BlockPaddle())
import ppdsl, ppdsl.cli
from ppdsl.cli import build_parser, main

_, commands = build_parser()
d = sys.argv[1]
runs = [  # (argv, the exit status it must give)
    (["fmt", "--check", d + "/a.pps"], 0),
    (["expand", d + "/a.pps", "-o", d + "/e.pps"], 0),
    (["expand", d + "/g.pps", "-o", d + "/e2.pps"], 0),
    (["convert", d + "/a.pps", d + "/a.csv"], 0),
    (["convert", d + "/a.csv", d + "/b.pps"], 0),
    (["simulate", d + "/g.pps"], 0),
]
if "lint" in commands:
    runs += [(["lint", d + "/a.pps"], 0), (["lint", d + "/bad.pps"], 1)]
for argv, wanted in runs:
    code = main(argv)
    assert code == wanted, (argv, code)  # never an import failure (2)
assert not [m for m in sys.modules if m.split(".")[0] in ("paddle", "torch")]
print("ran", len(runs))
"""


def test_commands_run_with_paddle_blocked(tmp_path: Path) -> None:
    (tmp_path / "a.pps").write_text("pipeline ranks=2 microbatches=2\nrank 0: 0F{0..1} 0B{0..1}\nrank 1: 1F0 1B0 1F1 1B1\n")
    (tmp_path / "g.pps").write_text("pipeline ranks=2 microbatches=2\nuse 1f1b()\n")
    (tmp_path / "bad.pps").write_text("pipeline ranks=2 microbatches=2\nrank 0: 0F0 0F1 0B0\nrank 1: 1F0 1B0 1F1 1B1\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "ran 8"
    assert (tmp_path / "a.csv").read_text() == "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"
