"""`use search(max_memory=L)` in a `.pps` file: the schedule the search finds, as generated rows.

A generator like the others (`SPEC`), listed with them where a `use` line is expanded
(`ppdsl/expansion.py`); it builds from the whole context, for it reads the file's costs line.

Deterministic (the search's budget is counted in candidates, never in seconds) and cached in
this process by its inputs (size, limit, shape and the file's `costs` line), so a file that
is linted, simulated and run in one process is searched once.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from typing import TYPE_CHECKING

from ..generators.registry import ArgValue, Built, Context, GeneratorError, GeneratorSpec, Param, require
from ..limits import MAX_FILE_SEARCH_PAIRS, MAX_SEARCH_ACTIONS
from ..memory import UNIT
from .slots import SLOTS

if TYPE_CHECKING:
    from ..costs import CostModel

NAME = "search"
SHAPES = {"loop": "1", "v": "2", "auto": "auto"}


def build_in(context: Context, values: Mapping[str, ArgValue]) -> Built:
    """The rows for `use search(...)` (its arguments checked, defaults filled in); problems are
    GeneratorErrors (PPS015, PPS022) naming the argument (told under it where the file writes it)."""
    # The search and the costs are imported by a file that uses them: this module is imported
    # wherever a `use` line may be expanded (ppdsl/expansion.py), for every .pps file.
    from ..costs import CostError, CostModel

    ranks, microbatches, costs = context.ranks, context.microbatches, context.costs
    limit = float(values["max_memory"])
    require(limit > 0, "`search` needs `max_memory=L`, a positive number of microbatches of a rank's share",
            "max_memory", help="e.g. use search(max_memory=3)")
    if ranks * microbatches > MAX_FILE_SEARCH_PAIRS:
        raise GeneratorError("PPS015", f"ranks={ranks} x microbatches={microbatches} is more than a file's "
                             f"`use search` takes ({MAX_FILE_SEARCH_PAIRS} ranks x microbatches, about 10 s): it "
                             "would search again each time the file is read",
                             help=f"write the schedule out once, with progress shown: ppdsl search --ranks {ranks} "
                             f"--microbatches {microbatches} --max-memory {limit:g} -o FILE.pps")
    actions = 2 * ranks * microbatches * SLOTS  # the V shape's stages, a search code each slot
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
            "shape=loop (one stage a rank) or shape=v (two)", "shape",
            help="e.g. use search(max_memory=3, shape=v)")
    try:
        model.check_stages(ranks * (1 if shape == "1" else 2))
    except CostError as exc:
        raise GeneratorError("PPS022", f"the costs line: {exc.message}", "shape") from None
    return _cached(ranks, microbatches, limit, shape, costs, model, MEMORY_ACTIONS[str(values["memory_actions"])])


# `memory_actions=`: which actions the search may place to fit the limit (`fit_memory`).
MEMORY_ACTIONS: dict[str, tuple[str, ...]] = {"none": (), "recompute": ("recompute",), "offload": ("offload",),
                                              "both": ("recompute", "offload")}


@functools.lru_cache(maxsize=32)
def _cached(ranks: int, microbatches: int, limit: float, shape: str, key: tuple[tuple[str, float], ...],
            costs: CostModel, memory_actions: tuple[str, ...] = ()) -> Built:
    from .driver import Found, search, shapes_of
    from .output import finish

    # Per-stage keys on a file's costs line number the program's own stages.
    result = search(ranks, microbatches, costs, limit, shapes_of(shape), cuts=ranks * (2 if shape == "2" else 1), exact=False,
                    memory_actions=memory_actions)
    if not isinstance(result, Found):
        raise GeneratorError("PPS022", f"no schedule fits max_memory={limit:g}: the smallest feasible is "
                             f"{result.smallest:g} ({UNIT})", "max_memory")
    found = finish(result, costs)
    return Built(tuple(found.program.rows), found.program.stages, found.program.placement)


def _without_costs(ranks: int, microbatches: int, values: Mapping[str, ArgValue]) -> Built:
    """The search where no costs line is given (the default costs)."""
    return build_in(Context(ranks, microbatches), values)


SPEC = GeneratorSpec(
    name=NAME,
    summary="the shortest schedule `ppdsl search` finds under a memory limit and the file's costs",
    placement="loop or v (shape=loop|v|auto)",
    build=_without_costs,
    steps=None,
    params=(Param("max_memory", float, 0.0, "peak activations per rank, in microbatches of a rank's share"),
            Param("shape", str, "auto", "loop (1 stage a rank), v (2) or auto (both)", choices=tuple(SHAPES)),
            Param("memory_actions", str, "none", "none, or the actions it may place to fit the limit: recompute, "
                  "offload or both", choices=("none", "recompute", "offload", "both"))),
    reference="docs/search.md",
    build_in=build_in,
)
