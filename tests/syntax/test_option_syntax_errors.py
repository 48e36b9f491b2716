"""Mistakes inside `name(...)` and header options: said as what they are, not as a bracket."""

from __future__ import annotations

import pytest

from ppdsl.diagnostics import PpsError
from ppdsl.expansion import parse


@pytest.mark.parametrize("line, message, column, help", [
    ("use 1f1b(virtual)", "expected `=` after `virtual`", 17, "options are NAME=VALUE, e.g. `virtual=2`"),
    ("use vpp(virtual 2)", "expected `=` after `virtual`", 17, "options are NAME=VALUE, e.g. `virtual=2`"),
    ("use vpp(virtual=2,)", "a trailing comma", 18,
     "delete the `,`: commas only separate options, as in `vpp(virtual=2, chunks=1)`"),
    ("use vpp(virtual=2,,chunks=1)", "a comma with no option after it", 18,
     "delete the `,`: commas only separate options, as in `vpp(virtual=2, chunks=1)`"),
])
def test_option_mistakes_in_a_use_line(line: str, message: str, column: int, help: str) -> None:
    with pytest.raises(PpsError) as info:
        parse(f"pipeline ranks=2 microbatches=2\n{line}\n", "x.pps")
    (d,) = info.value.diagnostics
    assert (d.code, d.message, d.line, d.column, d.help) == ("PPS002", message, 2, column, help)


def test_a_header_option_without_equals() -> None:
    with pytest.raises(PpsError) as info:
        parse("pipeline ranks 2 microbatches=2\n", "x.pps")
    (d,) = info.value.diagnostics
    assert (d.code, d.message, d.column) == ("PPS002", "expected `=` after `ranks`", 16)
