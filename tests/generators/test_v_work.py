"""v_half / v_min build in bounded time at any size the limits allow, within their memory."""

from __future__ import annotations

import time

import pytest

from ppdsl.generators import registry
from ppdsl.generators.v_schedules import half_budget, min_budget
from ppdsl.ir import Program
from ppdsl.memory import peak_memory
from ppdsl.placement import v_shape


@pytest.mark.slow
@pytest.mark.parametrize("name, budget", [("v_half", half_budget), ("v_min", min_budget)])
@pytest.mark.parametrize("ranks, microbatches", [(104, 104), (10_000, 1), (16, 682)])
def test_a_large_v_is_built_quickly_within_its_memory(name: str, budget: object, ranks: int,
                                                      microbatches: int) -> None:
    # scripts/fuzz.py: 104 x 104 took 17 s (the squeeze re-priced a whole grid per free slot
    # tried), 10,000 x 1 hours (laying out walks ranks x 6 ranks slots); each is under 65,536 steps.
    start = time.process_time()
    built = registry.expand(name, ranks, microbatches, {})
    assert time.process_time() - start < 4
    program = Program(ranks, 2 * ranks, microbatches, v_shape(ranks, 2 * ranks), built.rows)
    assert sum(map(len, built.rows)) == 6 * ranks * microbatches
    assert max(peak_memory(program)) <= budget(ranks)  # type: ignore[operator]
