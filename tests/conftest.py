"""Shared fixtures: paths into the repository and the shared PyTorch vectors."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The runtime tests' helper scripts (models, rank scripts, launch helpers), importable by name
# as the scripts import each other.
sys.path.insert(0, str(ROOT / "tests" / "runtime" / "helpers"))
SCHEDULES = ROOT / "schedules"
# The PyTorch CSV files live beside the repository in ../shared; CI lays a copy there too. A
# checkout elsewhere (a git worktree) names them with PPDSL_VECTORS.
VECTORS = Path(os.environ.get("PPDSL_VECTORS", ROOT.parent / "shared" / "vectors" / "torch"))


@pytest.fixture
def vectors() -> Path:
    if not VECTORS.is_dir():
        pytest.skip("../shared/vectors/torch is not present")
    return VECTORS
