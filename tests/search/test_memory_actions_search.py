"""The search may recompute or offload to meet a memory limit: `fit_memory.fit` places the
actions in a schedule too big for the limit, and `search(memory_actions=...)`, `ppdsl search
--memory-actions` and `use search(memory_actions=...)` return such a schedule when it is shorter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ppdsl.check import check
from ppdsl.cli import main
from ppdsl.costs import parse_inline
from ppdsl.expansion import parse
from ppdsl.ir import Kind
from ppdsl.search.driver import Found, Infeasible, search
from ppdsl.search.fit_memory import fit
from ppdsl.search.output import finish
from ppdsl.simulate import simulate

UNIT_COSTS = "F=1,B=2,I=1,W=1"


def generated(call: str, ranks: int = 4, microbatches: int = 8) -> object:
    return parse(f"pipeline ranks={ranks} microbatches={microbatches}\nuse {call}\n", "g.pps")


@pytest.mark.parametrize("call, limit", [("1f1b()", 1.0), ("interleaved_1f1b(virtual=2)", 1.0), ("gpipe()", 1.0),
                                         ("1f1b()", 2.0), ("v_half()", 2.0), ("gpipe()", 2.0)])
@pytest.mark.parametrize("how", ["recompute", "offload"])
def test_fit_brings_every_rank_within_the_limit_and_lints_clean(call: str, how: str, limit: float) -> None:
    program = generated(call)
    fitted = fit(program, limit, how)  # type: ignore[arg-type]
    assert fitted is not None
    assert [d for d in check(fitted, max_memory=limit) if d.is_error] == []
    sim = simulate(fitted, UNIT_COSTS)
    assert sim.completed and max(sim.peak_memory) <= limit + 1e-9
    # The computes are the program's, in the same order on every rank: only memory actions were added.
    for before, after in zip(program.rows, fitted.rows):  # type: ignore[attr-defined]
        assert [a for a in after if a.kind not in (Kind.R, Kind.OFFLOAD, Kind.RELOAD)] == list(before)
    added = {a.kind for row in fitted.rows for a in row} & {Kind.R, Kind.OFFLOAD, Kind.RELOAD}
    assert added == ({Kind.R} if how == "recompute" else {Kind.OFFLOAD, Kind.RELOAD})


def test_fit_evicts_the_microbatch_needed_last() -> None:
    # One rank, three forwards then three backwards, room for 2: the first forward's
    # activations (backward last) go, not the second's.
    program = parse("pipeline ranks=1 microbatches=3\nrank 0: 0F0 0F1 0F2 0B2 0B1 0B0\n", "p.pps")
    fitted = fit(program, 2.0, "offload")
    assert fitted is not None
    assert " ".join(map(str, fitted.rows[0])) == "0F0 0F1 0OFFLOAD0 0F2 0B2 0RELOAD0 0B1 0B0"
    recomputed = fit(program, 2.0, "recompute")
    assert recomputed is not None
    assert " ".join(map(str, recomputed.rows[0])) == "0F0 0F1 0F2 0B2 0B1 0R0 0B0"


def test_fit_reloads_a_step_early_where_the_limit_allows() -> None:
    program = parse("pipeline ranks=1 microbatches=4\nrank 0: 0F0 0F1 0F2 0F3 0B3 0B2 0B1 0B0\n", "p.pps")
    # Room for 3: 0RELOAD0 goes one action ahead of 0B0's, before 0B1 (a copy lane can hide it
    # there).
    assert " ".join(map(str, fit(program, 3.0, "offload").rows[0])) == (  # type: ignore[union-attr]
        "0F0 0F1 0F2 0OFFLOAD0 0F3 0B3 0B2 0RELOAD0 0B1 0B0")
    # With room for 1 only, each waits until its backward.
    tight = fit(program, 1.0, "offload")
    assert tight is not None
    assert " ".join(map(str, tight.rows[0])) == (
        "0F0 0OFFLOAD0 0F1 0OFFLOAD1 0F2 0OFFLOAD2 0F3 0B3 0RELOAD2 0B2 0RELOAD1 0B1 0RELOAD0 0B0")
    assert [d for d in check(tight, max_memory=1.0) if d.is_error] == []


def test_fit_gives_none_where_no_eviction_helps() -> None:
    # zb1p's and v_half's W's keep what each I left until they run: more than 1 at once.
    assert fit(generated("zb1p()"), 1.0, "offload") is None  # type: ignore[arg-type]
    assert fit(generated("v_half()"), 1.0, "recompute") is None  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="how must be one of"):
        fit(generated("1f1b()"), 1.0, "swap")  # type: ignore[arg-type]


def test_search_with_memory_actions_beats_1f1b_recomputing_everything() -> None:
    costs = parse_inline(UNIT_COSTS)
    baseline = simulate(generated("1f1b(recompute=all)", 4, 16), costs)  # type: ignore[arg-type]
    plain = search(4, 16, costs, 1.5, exact=False)
    moved = search(4, 16, costs, 1.5, exact=False, memory_actions=("recompute",))
    assert isinstance(plain, Found) and isinstance(moved, Found)
    assert moved.moved == "recompute" and moved.makespan < plain.makespan
    assert moved.makespan <= 0.9 * baseline.makespan
    assert not moved.optimal and moved.lower_bound <= moved.makespan
    found = finish(moved, costs)  # checked, lowered, priced again
    assert max(simulate(found.program, costs).peak_memory) <= 1.5


def test_below_one_microbatch_only_memory_actions_fit() -> None:
    costs = parse_inline(UNIT_COSTS)
    assert isinstance(search(4, 8, costs, 0.75, exact=False), Infeasible)
    found = search(4, 8, costs, 1.0, exact=False, memory_actions=("offload",))
    assert isinstance(found, Found) and found.peak <= 1.0
    with pytest.raises(ValueError, match="not in bytes"):
        search(4, 8, costs, 1.0, memory_actions=("offload",), in_bytes=object())  # type: ignore[arg-type]


def test_cli_and_use_search(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "found.pps"
    assert main(["search", "--ranks", "4", "--microbatches", "16", "--max-memory", "1.5", "--costs", UNIT_COSTS,
                 "--memory-actions", "both", "-o", str(out)]) == 0
    text = out.read_text()
    assert "placed to fit the limit" in text.splitlines()[0]
    assert main(["lint", str(out)]) == 0
    capsys.readouterr()
    assert main(["search", "--ranks", "4", "--microbatches", "16", "--max-memory", "1.5", "--costs", UNIT_COSTS,
                 "--memory-actions", "recompute", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["memory_actions"] == "recompute" and "0R" in data["schedule"]
    use = tmp_path / "use.pps"
    use.write_text(f"pipeline ranks=4 microbatches=16\ncosts {UNIT_COSTS.replace(',', ' ')}\n"
                   "use search(max_memory=1.5, memory_actions=recompute)\n")
    assert main(["lint", str(use)]) == 0
    assert main(["expand", str(use)]) == 0
    assert "R" in capsys.readouterr().out.split("rank 0:")[1].split("\n")[0]
    assert main(["search", "--ranks", "2", "--microbatches", "4", "--max-memory", "1MiB", "--memory-actions",
                 "offload"]) == 2
    assert "not in bytes" in capsys.readouterr().err


def test_a_generator_that_moves_activations_is_no_yardstick_for_the_search_without_them() -> None:
    from ppdsl.search.named import named_results

    costs = parse_inline(UNIT_COSTS)
    assert "pipeoffload" not in {n.name for n in named_results(4, 8, costs)}
    moving = {n.name: n for n in named_results(4, 8, costs, moves=True)}
    assert moving["pipeoffload"].peak < moving["interleaved_1f1b"].peak
    # With offloads allowed, pipeoffload is a candidate as it stands.
    found = search(4, 8, costs, moving["pipeoffload"].peak, exact=False, memory_actions=("offload",))
    assert isinstance(found, Found) and found.makespan <= moving["pipeoffload"].makespan
