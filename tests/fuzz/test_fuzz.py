"""A few hundred fuzz inputs through every command (the 10,000 are `scripts/fuzz.py`).

Hypothesis picks the mutations (derandomized: the same inputs on every run, so a failure is
a defect, not luck); each input runs in a memory-limited worker with a time limit, and any
defect of `harness.Result` fails the test with its reproducer.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))

import harness  # noqa: E402

SEEDS = harness.seed_texts()
FUZZ = settings(max_examples=15, derandomize=True, database=None, deadline=None,
                suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def pool() -> Iterator[harness.Pool]:
    p = harness.Pool(1, wall=60)
    yield p
    p.close()


def run(pool: harness.Pool, case: harness.Case) -> None:
    (result,) = pool.run([case])
    assert not result.defect, f"{result.outcome}: {result.case.reproducer()}\n{result.detail}"


@pytest.mark.slow
@pytest.mark.parametrize("command", harness.COMMANDS)
@FUZZ
@given(seed=st.integers(0, 2**32 - 1))
def test_mutated_inputs_end_well(pool: harness.Pool, command: str, seed: int) -> None:
    run(pool, harness.make_case(random.Random(seed), SEEDS, command))


@pytest.mark.slow
@settings(max_examples=30, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.binary(max_size=300), command=st.sampled_from(("lint", "show", "convert to csv", "convert to pps")))
def test_arbitrary_bytes_end_well(pool: harness.Pool, data: bytes, command: str) -> None:
    run(pool, harness.Case(command, "in.csv" if command == "convert to pps" else "in.pps", data))


# Reproducers of issue 14, through the same harness.
@pytest.mark.slow
@pytest.mark.parametrize("case", [
    harness.Case("lint", "in.pps", b"#\rn\nuse"),
    harness.Case("fmt", "in.pps", b"pipeline ranks=65535 microbatches=1\nuse zb2p()\n"),
    harness.Case("show", "in.pps", b"pipeline ranks=1 microbatches=1\nrank 0: " + b"0F{0..0} " * 60_000 + b"\n"),
    harness.Case("simulate --costs", "costs.txt", b"F=1,F=1e-320,B=2"),
    harness.Case("convert to csv", "in.pps", b"pipeline ranks=1 microbatches=1\nrank 0:\n"),
], ids=["cr-line", "zb2p-65535", "repeated-range", "subnormal-cost", "empty-row-csv"])
def test_issue_reproducers(pool: harness.Pool, case: harness.Case) -> None:
    run(pool, case)


def test_the_harness_catches_a_defect(pool: harness.Pool) -> None:
    # A command the table does not know raises in the worker outside main(): the worker dies,
    # and the pool must report that (and start another), not pass it.
    (result,) = pool.run([harness.Case("no such command", "in.pps", b"")])
    assert result.defect and result.outcome == "died"
    run(pool, harness.Case("lint", "in.pps", b"pipeline ranks=1 microbatches=1\nrank 0: 0F0 0B0\n"))


# Found by scripts/fuzz.py after the reproducers above were fixed: small files asking for
# millions of steps, and a V schedule whose construction grew faster than its steps.
@pytest.mark.slow
@pytest.mark.parametrize("case", [
    harness.Case("lint", "in.pps", b"pipeline ranks=4 microbatches=65536\nuse v_min()\n"),
    harness.Case("show", "in.pps", b"pipeline ranks=104 microbatches=104\nuse v_half()\n"),
    harness.Case("simulate", "in.pps", b"pipeline ranks=1 microbatches=1048576\nrank 0: 0F{0..1048575}\n"),
], ids=["v_min-65536", "v_half-104", "long-range"])
def test_small_files_asking_for_many_steps(pool: harness.Pool, case: harness.Case) -> None:
    run(pool, case)
