"""schedules/: every file parses, is sound, is formatted, and the README table is current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gen_helpers import problems
from ppdsl.generators import registry
from ppdsl.load import load_program
from ppdsl.syntax.formatter import format_text

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted((ROOT / "schedules").glob("*.pps"))


def test_a_file_per_generator() -> None:
    made = {load_program(str(f)).generated for f in FILES}
    names = {g.name for g in made if g is not None}
    assert names == set(registry.REGISTRY)


@pytest.mark.parametrize("path", FILES, ids=[f.name for f in FILES])
def test_file_is_sound_and_formatted(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert format_text(text, str(path)) == text, f"run `ppdsl fmt {path.name}`"
    assert not problems(load_program(str(path)))


def test_written_out_1f1b_is_the_generated_one() -> None:
    written = load_program(str(ROOT / "schedules" / "1f1b_written_out.pps"))
    generated = load_program(str(ROOT / "schedules" / "1f1b.pps"))
    assert written.rows == generated.rows


def test_readme_table_is_current() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "schedule_table.py"), "--check"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
