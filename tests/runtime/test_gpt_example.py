"""examples/gpt: the small GPT trains, and every split-backward schedule family verifies on it
at 2 and 4 ranks (stages pass a (hidden, mask) tuple; the mask goes forward only)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from ppdsl.cli import main
from procs import generator_files

needs_paddle = pytest.mark.skipif(importlib.util.find_spec("paddle") is None, reason="needs paddle")
ROOT = Path(__file__).parents[2]
GPT = str(ROOT / "examples" / "gpt" / "model.py")
SCHEDULES = ["1f1b()", "zb1p()", "interleaved_1f1b(virtual=2)", "zbv()"]


def test_the_shipped_corpus_is_what_its_script_writes() -> None:
    sys.path.insert(0, str(ROOT / "examples" / "gpt"))
    try:
        import make_corpus
    finally:
        sys.path.pop(0)
    text = (ROOT / "examples" / "gpt" / "corpus.txt").read_text(encoding="ascii")
    assert len(text) == make_corpus.SIZE and text == make_corpus.corpus()


@pytest.mark.slow
@needs_paddle
@pytest.mark.parametrize("ranks", [2, 4])
def test_gpt_verifies_under_each_schedule(ranks: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = generator_files(tmp_path, SCHEDULES, ranks=ranks, suffix=f"_{ranks}")
    code = main(["run", *files, "--model", GPT, "--steps", "2", "--verify", "-q", "--timeout", "30"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    for f in files:
        assert re.search(rf"{re.escape(f)}: 2 steps, .*verify ok", out), out


@pytest.mark.slow
@needs_paddle
def test_gpt_loss_falls_under_zbv(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(ROOT / "schedules" / "zbv.pps"), "--model", GPT, "--steps", "6", "-q",
                 "--optimizer", "adam", "--lr", "3e-3"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    first, last = map(float, re.search(r"loss ([0-9.]+) -> ([0-9.]+)", out).groups())  # type: ignore[union-attr]
    assert last < first - 0.5, out  # from ~ln(256) = 5.5 towards the corpus' byte statistics
