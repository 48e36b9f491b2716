"""ppdsl/memory.py: the one activation model, step by step and by prefix sums over the codes."""

from __future__ import annotations

from ppdsl.encoding import encode
from ppdsl.memory import peaks_from_codes, profile
from ppdsl.expansion import parse


def test_an_overlapped_pair_allocates_before_it_frees() -> None:
    # Step 2 runs F1 while B0 frees F0's activation: both are live at that step.
    program = parse("pipeline ranks=1 microbatches=2\nrank 0: 0F0 _ (0F1;0B0) 0B1\n")
    prof = profile(program)
    assert prof.peak == (2.0,) and prof.peak_step == (2,)
    assert prof.live_after == ((1.0, 1.0, 1.0, 0.0),)
    assert peaks_from_codes(encode(program), None) is None  # prefix sums cannot say it: profile does


def test_a_split_backward_frees_on_w_and_weights_count() -> None:
    program = parse("pipeline ranks=1 microbatches=2 stages=2\n"
                    "rank 0: 0F0 1F0 1I0 0F1 1F1 0I0 1W0 1I1 0W0 1W1 0I1 0W1\n")
    prof = profile(program, [2.0, 0.5])
    # 0F0 1F0 (2.5) 1I0 (still 2.5: I frees nothing) 0F1 (4.5) 1F1 (5.0) ...
    assert prof.peak == (5.0,) and prof.peak_step == (4,)
    assert prof.live_after[0][-1] == 0.0
    assert peaks_from_codes(encode(program), [2.0, 0.5]) == [(5.0, 4)]


def test_a_full_and_a_split_backward_of_one_microbatch_take_the_careful_path() -> None:
    # Invalid for the checker (PPS105), but the model still says what it means: the B of a
    # split microbatch frees nothing, its W does; one sign per kind cannot express that.
    program = parse("pipeline ranks=1 microbatches=1\nrank 0: 0F0 0B0 0I0 0W0\n")
    assert profile(program).live_after == ((1.0, 1.0, 1.0, 0.0),)
    assert peaks_from_codes(encode(program), None) == [(1.0, 0)]
