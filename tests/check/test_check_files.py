"""Real files: PyTorch's three schedules lint clean; Paddle's Schedule1F1B comm order is flagged
under rendezvous with the cycle named and clean under grouped; the shipped schedules are clean."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import SCHEDULES
from paddle_1f1b_order import paddle_1f1b_text
from ppdsl.check import check
from ppdsl.encoding import encode
from ppdsl.load import load_program
from ppdsl.lower import lower

DATA = Path(__file__).parent / "data"


def test_pytorch_vectors_lint_clean(vectors: Path) -> None:
    files = sorted(vectors.glob("*.csv"))
    assert len(files) == 3
    for f in files:
        program = load_program(str(f))
        assert check(program) == [], f.name
        if not encode(program).has_comms:
            assert check(lower(program)) == [], f.name


@pytest.mark.parametrize("ranks,microbatches", [(2, 4), (4, 8)])
def test_paddle_1f1b_deadlocks_on_gloo_not_on_nccl(ranks: int, microbatches: int) -> None:
    path = DATA / f"paddle_1f1b_{ranks}ranks.pps"
    assert path.read_text() == paddle_1f1b_text(ranks, microbatches), "regenerate with paddle_1f1b_order.py"
    program = load_program(str(path))
    found = check(program, "rendezvous")
    assert [d.code for d in found] == ["PPS210"]
    d = found[0]
    # The cycle: a forward send batched before a backward receive on one side, a backward
    # send before a forward receive on the other; both block.
    last, prev = ranks - 1, ranks - 2
    assert f"rank {prev} waits at step" in d.message and f"`{prev}SEND_F1` for rank {last}" in d.message
    assert f"`{last}SEND_B0` for rank {prev}" in d.message
    assert d.line > 1 and d.column > 1 and d.rank == prev
    assert check(program, "grouped") == []
    assert check(program, "buffered") == []


def test_shipped_schedules_have_no_errors() -> None:
    files = sorted(SCHEDULES.glob("*.pps"))
    assert files
    for f in files:
        program = load_program(str(f))
        assert [d for d in check(program) if d.is_error] == [], f.name
