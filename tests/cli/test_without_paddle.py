"""Parsing, formatting, expanding, converting and linting never import paddle."""

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
        if name == "paddle" or name.startswith("paddle."):
            raise ImportError("paddle is blocked in this test: " + name)
        return None

sys.meta_path.insert(0, BlockPaddle())
import ppdsl, ppdsl.cli
from ppdsl.cli import build_parser, main

_, commands = build_parser()
d = sys.argv[1]
runs = [
    ["fmt", "--check", d + "/a.pps"],
    ["expand", d + "/a.pps", "-o", d + "/e.pps"],
    ["expand", d + "/g.pps", "-o", d + "/e2.pps"],
    ["convert", d + "/a.pps", d + "/a.csv"],
    ["convert", d + "/a.csv", d + "/b.pps"],
]
if "lint" in commands:
    runs.append(["lint", d + "/a.pps"])
for argv in runs:
    code = main(argv)
    assert code in (0, 1), (argv, code)  # 1: lint may find problems; never an import failure (2)
assert not [m for m in sys.modules if m == "paddle" or m.startswith("paddle.")]
print("ran", len(runs))
"""


def test_commands_run_with_paddle_blocked(tmp_path: Path) -> None:
    (tmp_path / "a.pps").write_text("pipeline ranks=2 microbatches=2\nrank 0: 0F{0..1} 0B{0..1}\nrank 1: 1F0 1B0 1F1 1B1\n")
    (tmp_path / "g.pps").write_text("pipeline ranks=2 microbatches=2\nuse 1f1b()\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ran ")
    assert (tmp_path / "a.csv").read_text() == "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"
