"""docs/comm-models.md: each two-rank example gets the verdict its table states."""

from __future__ import annotations

import re

from conftest import ROOT
from ppdsl.check import check
from ppdsl.expansion import parse

PAGE = ROOT / "docs" / "comm-models.md"


def examples() -> list[str]:
    return re.findall(r"^```pps\n(.*?)^```", PAGE.read_text(encoding="utf-8"), flags=re.S | re.M)


def verdicts(text: str) -> dict[str, list[str]]:
    program = parse(text)
    return {m: [d.code for d in check(program, m)] for m in ("rendezvous", "grouped", "buffered")}


def test_the_three_examples() -> None:
    fine, both_send, batches, out_of_order = examples()
    assert verdicts(fine) == {"rendezvous": [], "grouped": [], "buffered": []}
    assert verdicts(both_send) == {"rendezvous": ["PPS210"], "grouped": ["PPS210"], "buffered": []}
    assert verdicts(batches) == {"rendezvous": ["PPS210"], "grouped": [], "buffered": []}
    message = check(parse(batches))[0].message
    assert "rank 0 waits at step 3 `0SEND_F1` for rank 1, which waits at step 3 `1SEND_B0` for rank 0" in message
    assert verdicts(out_of_order) == {"rendezvous": ["PPS212"], "grouped": ["PPS212"], "buffered": ["PPS212"]}
    message = check(parse(out_of_order, "x.pps"))[0].message
    assert ("the 1st message rank 0 sends is `0SEND_F1` (x.pps:2:17), but the 1st receive rank 1 posts is `1RECV_F0` "
            "(x.pps:3:9)") in message
