"""`mypy --strict` over the package is part of the test suite."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import ROOT


@pytest.mark.slow
def test_mypy_strict_passes() -> None:
    if shutil.which("mypy") is None and subprocess.run([sys.executable, "-m", "mypy", "--version"],
                                                       capture_output=True).returncode != 0:
        pytest.fail("mypy is not installed: install the dev extra")
    result = subprocess.run([sys.executable, "-m", "mypy", "--strict", "ppdsl"], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_mypy_strict_passes_where_paddle_and_numpy_are_not_installed(tmp_path: Path) -> None:
    # An environment with every package of this one but paddle and numpy (the `paddle` extra):
    # a bare venv whose one .pth file points at links to the others.
    if subprocess.run([sys.executable, "-m", "mypy", "--version"], capture_output=True).returncode != 0:
        pytest.fail("mypy is not installed: install the dev extra")
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    python = env / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    links = tmp_path / "packages"
    links.mkdir()
    for where in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        for entry in Path(where).iterdir():
            if not entry.name.lower().startswith(("paddle", "numpy")) and not (links / entry.name).exists():
                (links / entry.name).symlink_to(entry)
    Path(site, "others.pth").write_text(str(links) + "\n")
    probe = subprocess.run([str(python), "-c", "import lark, attrs\ntry:\n import paddle\nexcept ImportError:\n print('no paddle')"],
                           capture_output=True, text=True, timeout=60)
    assert probe.stdout.strip() == "no paddle", probe.stderr
    result = subprocess.run([sys.executable, "-m", "mypy", "--strict", "ppdsl", "--python-executable", str(python),
                             "--cache-dir", str(tmp_path / "cache")], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
