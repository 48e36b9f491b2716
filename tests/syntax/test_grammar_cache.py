"""The built LALR tables are cached in the user's cache directory; a damaged or unwritable
cache never changes what a command does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = "import sys\nfrom ppdsl.cli import main\nsys.exit(main(['lint', sys.argv[1]]))\n"


def lint(tmp_path: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    f = tmp_path / "s.pps"
    f.write_text("pipeline ranks=1 microbatches=1\nrank 0: 0F0 0B0 0F1\n")
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    return subprocess.run([sys.executable, "-c", SCRIPT, str(f)], capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.slow
def test_the_tables_are_kept_and_a_damaged_file_is_rebuilt(tmp_path: Path) -> None:
    first = lint(tmp_path, tmp_path / "cache")
    (kept,) = (tmp_path / "cache" / "ppdsl").iterdir()
    assert first.returncode == 1 and "PPS014" in first.stdout
    kept.write_bytes(b"not a pickle\n" * 10)
    again = lint(tmp_path, tmp_path / "cache")
    assert (again.returncode, again.stdout, again.stderr) == (first.returncode, first.stdout, first.stderr)
    assert not kept.read_bytes().startswith(b"not a pickle") and len(kept.read_bytes()) > 1000  # rebuilt


def test_no_writable_cache_directory_still_parses(tmp_path: Path) -> None:
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    done = lint(tmp_path, blocked)
    assert done.returncode == 1 and "PPS014" in done.stdout and done.stderr.count("Traceback") == 0
