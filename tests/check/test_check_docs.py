"""docs/comm-models.md: each two-rank example gets the verdict its table states."""

from __future__ import annotations

import re

from conftest import ROOT
from ppdsl.check import check
from ppdsl.syntax.parser import parse

PAGE = ROOT / "docs" / "comm-models.md"


def examples() -> list[str]:
    return re.findall(r"^```pps\n(.*?)^```", PAGE.read_text(encoding="utf-8"), flags=re.S | re.M)


def verdicts(text: str) -> dict[str, list[str]]:
    program = parse(text)
    return {m: [d.code for d in check(program, m)] for m in ("rendezvous", "grouped", "buffered")}


def test_the_three_examples() -> None:
    fine, both_send, batches = examples()
    assert verdicts(fine) == {"rendezvous": [], "grouped": [], "buffered": []}
    assert verdicts(both_send) == {"rendezvous": ["PPS210"], "grouped": ["PPS210"], "buffered": []}
    assert verdicts(batches) == {"rendezvous": ["PPS210"], "grouped": [], "buffered": []}
    message = check(parse(batches))[0].message
    assert "rank 0 waits at step 3 `0SEND_F1` for rank 1, which waits at step 3 `1SEND_B0` for rank 0" in message
