"""Reading files: whole, bounded by the limit, and with no buffer sized by the limit."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from ppdsl import files
from ppdsl.diagnostics import UsageError


def test_a_file_is_read_whole_up_to_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "MAX_FILE_BYTES", 4096)
    at_limit = tmp_path / "at.pps"
    at_limit.write_bytes(bytes(range(256)) * 16)
    assert files.read_bytes(str(at_limit)) == at_limit.read_bytes()
    over = tmp_path / "over.pps"
    over.write_bytes(b"x" * 4097)
    with pytest.raises(UsageError, match="larger than"):
        files.read_bytes(str(over))


def test_reading_a_small_file_sets_aside_no_more_than_it_holds(tmp_path: Path) -> None:
    # A read of n bytes allocates n first: a buffer of the limit's size (512 MiB) would make
    # the kernel map a fresh page for every page the file fills, on every read.
    path = tmp_path / "small.pps"
    path.write_text("pipeline ranks=2 microbatches=2\nrank 0: 0F0\nrank 1: 1F0\n", encoding="utf-8")
    tracemalloc.start()
    try:
        files.read_bytes(str(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
