"""`print_program(..., compact=True)`: ranges and zips that parse back to the same program, and
never longer than writing every step."""

from __future__ import annotations

import pytest

from ppdsl.generators import registry
from ppdsl.ir import Program
from ppdsl.expansion import parse
from ppdsl.syntax.printer import compact_row, print_program


@pytest.mark.parametrize("name", sorted(registry.REGISTRY))
@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (3, 6)])  # sizes every generator accepts
def test_compact_round_trips_every_generator(name: str, p: int, m: int) -> None:
    built = registry.expand(name, p, m, {})
    program = Program(p, built.stages, m, built.placement, built.rows)
    compact = print_program(program, compact=True)
    assert parse(compact) == program
    assert len(compact) <= len(print_program(program))


def test_compact_folds_runs_and_zips() -> None:
    rows = parse("pipeline ranks=1 microbatches=8\nrank 0: 0F{0..3} [0B{0..3} 0F{4..7}] 0B{4..7}\n").rows
    assert compact_row(rows[0]) == "0F{0..3} [0B{0..3} 0F{4..7}] 0B{4..7}"
    assert compact_row(parse("pipeline ranks=1 microbatches=2\nrank 0: 0F0 0B0 0F1 0B1\n").rows[0]) == "0F0 0B0 0F1 0B1"
