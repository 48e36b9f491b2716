"""`scan.TokenReader` (whole-run C-level passes) and the reader that locates errors
(`scan.locate_run`, one `parse_word` a token) agree on every run: the same steps when both
accept, and a refusal exactly when the locator has an error to report."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppdsl.ir import IDLE, KIND_BY_NAME
from ppdsl.syntax import scan

BOUNDS = (6, 9)  # stages, microbatches
KINDS = [*KIND_BY_NAME, "BW", "X", "f", ""]
word = st.one_of(
    st.builds(lambda s, k, m: f"{s}{k}{m}", st.sampled_from(["0", "1", "5", "6", "05", "", "123456789012345678901"]),
              st.sampled_from(KINDS), st.sampled_from(["", "0", "3", "8", "9", "007", "x"])),
    st.sampled_from(["_", "_1", "__", "3_", "0F0x"]),
)


def careful(text: str) -> list[object] | None:
    out: list[object] = []
    return None if scan.locate_run(text, BOUNDS, out, IDLE, 1) else out


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(st.lists(word, min_size=1, max_size=12))
def test_fast_and_careful_reads_agree(words: list[str]) -> None:
    text = " ".join(words)
    reader = scan.TokenReader(KIND_BY_NAME, *BOUNDS, "_", IDLE)
    assert reader.steps(text.split()) == careful(text)


def test_a_reader_learns_and_keeps_refusing_what_is_out_of_bounds() -> None:
    reader = scan.TokenReader(KIND_BY_NAME, *BOUNDS, "_", IDLE)
    assert reader.steps(["0F0", "_", "5B8", "1UNSHARD"]) is not None
    assert reader.steps(["0F0", "6F0"]) is None and reader.steps(["0F9"]) is None
    assert reader.steps(["5B8", "0F0"]) is not None  # what it learned before still reads
    assert (reader.stage_ranks, reader.max_micro) == ({0: 0, 5: 0, 1: 0}, 8)
