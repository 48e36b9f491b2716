"""`use search(max_memory=L)` in a `.pps` file: the schedule the search finds, as generated rows.

Deterministic (the search's budget is counted in candidates, never in seconds) and cached in
this process by its inputs (size, limit, shape and the file's `costs` line), so a file that
is linted, simulated and run in one process is searched once.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from ..costs import CostError, CostModel
from ..generators.registry import Built, GeneratorError, GeneratorSpec, Param, check_arguments, require
from ..limits import MAX_SEARCH_ACTIONS
from ..memory import UNIT
from .driver import Found, search
from .output import finish

NAME = "search"
SHAPES = {"loop": "1", "v": "2", "auto": "auto"}


def _no_build(ranks: int, microbatches: int, args: Mapping[str, object]) -> Built:  # pragma: no cover
    raise AssertionError("search is expanded by expand_use, with the file's costs")


SPEC = GeneratorSpec(
    name=NAME,
    summary="the shortest schedule `ppdsl search` finds under a memory limit and the file's costs",
    placement="loop or v (shape=loop|v|auto)",
    build=_no_build,
    steps=None,
    params=(Param("max_memory", float, 0.0, "peak activations per rank, in microbatches of a rank's share"),
            Param("shape", str, "auto", "loop (1 stage a rank), v (2) or auto (both)", choices=tuple(SHAPES))),
    reference="docs/search.md",
)


def expand_use(ranks: int, microbatches: int, args: Mapping[str, object],
               costs: tuple[tuple[str, float], ...]) -> Built:
    """The rows for `use search(...)`; problems are GeneratorErrors (PPS022) naming the argument."""
    values = check_arguments(SPEC, args)
    limit = float(values["max_memory"])
    require(limit > 0, "`search` needs `max_memory=L`, a positive number of microbatches of a rank's share",
            "max_memory" if "max_memory" in args else None, help="e.g. use search(max_memory=3)")
    actions = 2 * ranks * microbatches * 3
    if actions > MAX_SEARCH_ACTIONS:
        raise GeneratorError("PPS015", f"ranks={ranks} x microbatches={microbatches} is {actions:,} actions to "
                             f"order, more than the search handles ({MAX_SEARCH_ACTIONS:,})",
                             help="use a named generator for a pipeline this large")
    try:
        model = CostModel(costs)
    except CostError as exc:  # the parser's caller reports the costs line itself; say it here too
        raise GeneratorError("PPS022", f"the costs line: {exc.message}") from None
    shape = SHAPES[str(values["shape"])]
    per_stage = any("_s" in key for key, _ in costs)
    require(not per_stage or shape != "auto", "with per-stage costs on the costs line, say which stages they number: "
            "shape=loop (one stage a rank) or shape=v (two)", "shape" if "shape" in args else None,
            help="e.g. use search(max_memory=3, shape=v)")
    try:
        model.check_stages(ranks * (1 if shape == "1" else 2))
    except CostError as exc:
        raise GeneratorError("PPS022", f"the costs line: {exc.message}", "shape" if "shape" in args else None) from None
    return _cached(ranks, microbatches, limit, shape, costs, model)


@functools.lru_cache(maxsize=32)
def _cached(ranks: int, microbatches: int, limit: float, shape: str, key: tuple[tuple[str, float], ...],
            costs: CostModel) -> Built:
    # Per-stage keys on a file's costs line number the program's own stages.
    result = search(ranks, microbatches, costs, limit, shape, cuts=ranks * (2 if shape == "2" else 1), exact=False)
    if not isinstance(result, Found):
        raise GeneratorError("PPS022", f"no schedule fits max_memory={limit:g}: the smallest feasible is "
                             f"{result.smallest:g} ({UNIT})", "max_memory")
    found = finish(result, costs)
    return Built(found.program.rows, found.program.stages, found.program.placement)
