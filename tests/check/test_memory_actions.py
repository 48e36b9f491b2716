"""The rules of `R`, `OFFLOAD` and `RELOAD` (ppdsl/check/memory_actions.py, PPS107 for their
forward), their memory (ppdsl/memory.py) and what the other passes make of them."""

from __future__ import annotations

import pytest

from ppdsl import memory
from ppdsl.encoding import encode
from ppdsl.check import check, lower_checked
from ppdsl.diagnostics import PpsError
from ppdsl.expansion import parse
from ppdsl.formats.torch_csv import write_csv
from ppdsl.syntax.printer import print_program

H1 = "pipeline ranks=1 microbatches=2\n"
GOOD = H1 + "rank 0: 0F0 0OFFLOAD0 0F1 0RELOAD0 0B0 0R1 0B1\n"


def codes(text: str) -> list[tuple[str, int | None, int | None]]:
    return [(d.code, d.rank, d.step) for d in check(parse(text, "p.pps"))]


def test_a_recompute_and_an_offload_in_place_lint_clean() -> None:
    assert codes(GOOD) == []
    assert codes(H1 + "rank 0: 0F0 0F1 0R0 0OFFLOAD0 0R1 0B1 0RELOAD0 0I0 0W0\n") == []


@pytest.mark.parametrize(("row", "found"), [
    ("0R0 0F0 0B0 0F1 0B1", [("PPS107", 0, 0)]),  # before its forward
    ("0F0 0R0 0R0 0B0 0F1 0B1", [("PPS104", 0, 2)]),  # twice
    ("0F0 0I0 0R0 0W0 0F1 0B1", [("PPS109", 0, 2)]),  # after the backward's first half
    ("0F0 0RELOAD0 0B0 0F1 0B1", [("PPS110", 0, 1)]),  # a reload of nothing
    ("0F0 0RELOAD0 0OFFLOAD0 0B0 0F1 0B1", [("PPS111", 0, 1)]),  # back before it went
    ("0F0 0OFFLOAD0 0RELOAD0 0R0 0B0 0F1 0B1", [("PPS111", 0, 1)]),  # moved before R makes it
    ("0F0 0F1 0R0 0OFFLOAD0 0R1 0B1 0I0 0RELOAD0 0W0", [("PPS111", 0, 6)]),  # I while on host
])
def test_each_rule_is_told_at_its_action(row: str, found: list[tuple[str, int, int]]) -> None:
    assert codes(H1 + f"rank 0: {row}\n") == found


def test_inference_has_no_use_for_a_recompute() -> None:
    assert codes("pipeline ranks=1 microbatches=1 mode=inference\nrank 0: 0F0 0R0\n") == [("PPS109", 0, 1)]


def test_memory_counts_the_input_only_forward_the_recompute_and_the_moves() -> None:
    # F of 0 (kept: 1), OFFLOAD (0), F of 1 with an R (its input only: 0), RELOAD (1), B (0),
    # R (1), B (0).
    program = parse(GOOD, "p.pps")
    assert memory.profile(program).live_after == ((1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0),)
    assert memory.peak_memory(program) == (1.0,)
    without = parse(H1 + "rank 0: 0F0 0F1 0B0 0B1\n", "p.pps")
    assert memory.peak_memory(without) == (2.0,)
    sizes = memory.Sizes([100.0], [40.0], [1000.0])
    assert memory.peak_bytes(program, sizes).peak == (1100.0,)
    # The checker's limit reads the same model.
    assert [d.code for d in check(program, max_memory=1)] == []
    assert [d.code for d in check(without, max_memory=1)] == ["PPS301"]


def test_bytes_count_what_a_forward_keeps_beside_its_saved_tensors() -> None:
    # Activation 100 bytes a microbatch, of which 30 (input and output) stay: F of 0 (100),
    # OFFLOAD (30), F of 1 with an R (30: 60), RELOAD (130), B (30), R (100), B (0).
    program = parse(GOOD, "p.pps")
    sizes = memory.Sizes([100.0], [40.0], [1000.0], input=[30.0])
    assert memory.profile(program, [100.0], [40.0], [30.0]).live_after == (
        (100.0, 30.0, 60.0, 130.0, 30.0, 100.0, 0.0),)
    assert memory.peak_bytes(program, sizes).peak == (1130.0,)
    # The prefix sums agree with the step-by-step walk.
    fast = memory.peaks_from_codes(encode(program), [100.0], kept=[40.0], inputs=[30.0])
    assert fast == [(130.0, 3)]
    # Carried over to more stages with the rest.
    assert memory.Sizes([100.0], [40.0], [1000.0], input=[30.0]).for_stages(2).input == (15.0, 15.0)
    with pytest.raises(ValueError, match="input and activation"):
        memory.Sizes([100.0], [40.0], [1000.0], input=[1.0, 2.0])


def test_bytes_count_the_messages_a_lowered_program_holds() -> None:
    # Activation 100 a microbatch on each stage, outputs 10 (stage 0) and 20 (stage 1).
    text = ("pipeline ranks=2 microbatches=1\n"
            "rank 0: 0F0 0SEND_F0 0RECV_B0 0B0\n"
            "rank 1: 1RECV_F0 1F0 1B0 1SEND_B0\n")
    program = parse(text, "p.pps")
    weights, kept = [100.0, 100.0], [0.0, 0.0]
    outputs = [10.0, 20.0]
    # Rank 0: F (100), its send (100), the gradient received (110), B (0).
    # Rank 1: the activation received (110), F takes it in (100), B frees it and makes the
    # input's gradient (10), its send (0).
    assert memory.profile(program, weights, kept, outputs=outputs).live_after == (
        (100.0, 100.0, 110.0, 0.0), (10.0, 100.0, 10.0, 0.0))
    sizes = memory.Sizes(weights, kept, [0.0, 0.0], output=outputs)
    assert memory.peak_bytes(program, sizes).peak == (110.0, 100.0)
    # A compute-only program's messages are instant: only a hand-over on one rank holds.
    assert memory.profile(parse("pipeline ranks=2 microbatches=1\nrank 0: 0F0 0B0\nrank 1: 1F0 1B0\n", "p.pps"),
                          weights, kept, outputs=outputs).live_after == ((100.0, 0.0), (100.0, 0.0))
    one_rank = parse("pipeline ranks=1 microbatches=1 stages=2\nrank 0: 0F0 1F0 1B0 0B0\n", "p.pps")
    assert memory.profile(one_rank, weights, kept, outputs=outputs).live_after == ((100.0, 200.0, 110.0, 0.0),)


def test_lowering_keeps_them_where_they_are() -> None:
    text = ("pipeline ranks=2 microbatches=2\nrank 0: 0F0 0OFFLOAD0 0F1 0RELOAD0 0B0 0R1 0B1\n"
            "rank 1: 1F0 1F1 1R0 1B0 1R1 1B1\n")
    lowered = lower_checked(parse(text, "p.pps"))
    assert check(lowered) == []
    row0 = print_program(lowered).splitlines()[-2]
    for order in (["0F0", "0OFFLOAD0", "0F1", "0RELOAD0", "0B0", "0R1", "0B1"], ["1R0", "1B0", "1R1", "1B1"]):
        written = print_program(lowered)
        assert [w for w in written.split() if w in order] == order, row0


def test_pytorch_s_csv_has_none_of_them() -> None:
    with pytest.raises(PpsError) as exc:
        write_csv(parse(GOOD, "p.pps"))
    (d,) = exc.value.diagnostics
    assert (d.code, d.line, d.column, d.is_error) == ("PPS031", 2, 13, True)
    assert "`0OFFLOAD0`" in d.message and "PyTorch's CSV has no `OFFLOAD`" in d.message
