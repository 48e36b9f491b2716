"""`mypy --strict` over the package is part of the test suite."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from conftest import ROOT


def test_mypy_strict_passes() -> None:
    if shutil.which("mypy") is None and subprocess.run([sys.executable, "-m", "mypy", "--version"],
                                                       capture_output=True).returncode != 0:
        pytest.fail("mypy is not installed: install the dev extra")
    result = subprocess.run([sys.executable, "-m", "mypy", "--strict", "ppdsl"], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
