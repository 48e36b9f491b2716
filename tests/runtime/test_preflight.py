"""The pre-flight before a run, and its bypass (`check=False`). No processes, no paddle."""

from __future__ import annotations

from pathlib import Path

import pytest
from soundness import ISSUE_BUFFERED_SWAP as OUT_OF_ORDER

import ppdsl
from ppdsl.diagnostics import PpsError
from ppdsl.load import load_program
from ppdsl.runtime.preflight import prepare
from ppdsl.semantics import CommModel

HAND = Path(__file__).parent / "schedules"


def test_the_checker_refuses_an_out_of_order_link_under_every_backend() -> None:
    for model in (CommModel.RENDEZVOUS, CommModel.GROUPED):
        with pytest.raises(PpsError) as info:
            prepare(ppdsl.parse(OUT_OF_ORDER), model)
        assert [d.code for d in info.value.diagnostics] == ["PPS212"]


def test_check_false_runs_the_program_as_written() -> None:
    program = ppdsl.parse(OUT_OF_ORDER)
    assert prepare(program, CommModel.RENDEZVOUS, check=False) == program
    deadlock = load_program(str(HAND / "2r_deadlock.pps"))
    assert prepare(deadlock, CommModel.RENDEZVOUS, check=False) == deadlock  # no Refused either


def test_check_false_still_lowers_a_compute_only_program() -> None:
    program = ppdsl.parse("pipeline ranks=2 microbatches=2\nuse gpipe()\n")
    lowered = prepare(program, CommModel.RENDEZVOUS, check=False)
    assert not program.has_comms and lowered.has_comms
    assert lowered == prepare(program, CommModel.RENDEZVOUS)
