"""One memory unit through every command: microbatches of a rank's activations.

For 1F1B, ZB-V, V-Half and V-Min at 4 ranks every number `ppdsl lint --max-memory`,
`ppdsl simulate` (text, comparison and JSON) and `ppdsl search` (its own replay and the
command) print or accept is the same, and is the zero-bubble papers' figure: p, p,
(p+2)//2, (p+4)//3. `run --profile` counts graphs per stage, v times that, and says so.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ppdsl.cli import main
from ppdsl.cli.run_cmd import memory_line
from ppdsl.costs import DEFAULT
from ppdsl.load import load_program
from ppdsl.memory import UNIT, peak_stage_activations
from ppdsl.search.named import named_results, seed_rows
from ppdsl.search.problem import make_problem
from ppdsl.search.replay import peaks

ROOT = Path(__file__).resolve().parents[2]
P = 4
PAPERS = {"1f1b": P, "zbv": P, "v_half": (P + 2) // 2, "v_min": (P + 4) // 3}
FILES = {name: str(ROOT / "schedules" / f"{name}.pps") for name in PAPERS}


def _printed(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().out


def test_the_files_are_the_papers_schedules_at_4_ranks() -> None:
    for name, path in FILES.items():
        program = load_program(path)
        assert program.ranks == P and program.generated is not None and program.generated.name == name


@pytest.mark.parametrize("name", PAPERS)
def test_lint_max_memory_admits_the_papers_peak_and_names_it_below(name: str,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    peak = PAPERS[name]
    assert _printed(["lint", "--max-memory", str(peak), FILES[name]], capsys)[0] == 0
    code, out = _printed(["lint", "--max-memory", f"{peak - 0.5:g}", FILES[name]], capsys)
    assert code == 1
    held = [float(x) for x in re.findall(rf"holds ([\d.]+) {re.escape(UNIT)} at step", out)]
    assert held and max(held) == peak, out


@pytest.mark.parametrize("name", PAPERS)
def test_the_header_memory_is_the_same_limit(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = Path(FILES[name]).read_text(encoding="utf-8").splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("pipeline "))
    for limit, expected in ((PAPERS[name], 0), (PAPERS[name] - 0.5, 1)):
        edited = [*lines[:at], f"{lines[at]} memory={limit:g}", *lines[at + 1:]]
        path = tmp_path / f"{name}.pps"
        path.write_text("\n".join(edited) + "\n", encoding="utf-8")
        assert _printed(["lint", str(path)], capsys)[0] == expected


def test_simulate_text_comparison_and_json_print_the_papers_peaks(capsys: pytest.CaptureFixture[str]) -> None:
    for name, path in FILES.items():
        code, out = _printed(["simulate", path], capsys)
        assert code == 0
        lines = out.splitlines()
        head = lines.index(next(line for line in lines if line.startswith("rank  busy")))
        table = [line.split() for line in lines[head + 1:head + 1 + P]]
        assert max(float(row[-1]) for row in table) == PAPERS[name], out
        assert out.count(UNIT) == 1, out  # the unit, said once
        code, out = _printed(["simulate", path, "--format", "json"], capsys)
        data = json.loads(out)
        assert max(data["peak_memory"]) == PAPERS[name] and data["memory_unit"] == UNIT
    code, out = _printed(["simulate", *FILES.values()], capsys)
    assert code == 0
    row = next(line for line in out.splitlines() if line.startswith("peak memory (max)"))
    assert [float(x) for x in row[len("peak memory (max)"):].split()] == list(PAPERS.values()), out
    assert out.count(UNIT) == 1, out


def test_the_search_replay_counts_the_named_schedules_the_same() -> None:
    results = {n.name: n for n in named_results(P, 8, DEFAULT)}
    assert {name: results[name].peak for name in PAPERS} == PAPERS
    for shape in (1, 2):
        problem = make_problem(P, 8, shape, 2 * P, DEFAULT)
        seeds = dict(seed_rows(problem, list(results.values())))
        replayed = {name: max(peaks(problem, seeds[name])) for name in PAPERS if name in seeds}
        assert replayed == {name: PAPERS[name] for name in replayed}
        assert set(replayed) == ({"1f1b"} if shape == 1 else {"zbv", "v_half", "v_min"})


@pytest.mark.parametrize("name", ["zbv", "v_half", "v_min"])
def test_search_at_the_papers_peak_finds_that_schedule_within_it(name: str, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    limit = PAPERS[name]
    code, out = _printed(["search", "--ranks", str(P), "--microbatches", "8", "--max-memory", str(limit),
                          "--stages-per-rank", "2", "--time-limit", "1", "--format", "json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["memory_unit"] == UNIT and data["limit"] == limit and data["peak_memory"] <= limit
    assert data["named"] == {"name": name, "makespan": data["named"]["makespan"], "peak_memory": limit}
    found = tmp_path / "found.pps"
    found.write_text(data["schedule"], encoding="utf-8")
    assert f"memory={limit:g}" in data["schedule"] and f"{UNIT}, as the header's memory=" in data["schedule"]
    assert _printed(["lint", str(found)], capsys)[0] == 0  # the header's limit, checked
    code, out = _printed(["simulate", str(found), "--format", "json"], capsys)
    assert max(json.loads(out)["peak_memory"]) == pytest.approx(data["peak_memory"])


def test_run_profile_counts_graphs_per_stage_and_says_so() -> None:
    for name, path in FILES.items():
        stages_per_rank = 1 if name == "1f1b" else 2
        assert max(peak_stage_activations(load_program(path))) == stages_per_rank * PAPERS[name]
    line = memory_line({"rank": 0, "peak_microbatches": 8, "predicted_microbatches": 8, "peak_bytes": 0})
    assert "peak 8 live graphs, one per stage and microbatch (checker predicts 8)" in line


def test_language_md_pps301_example_is_what_lint_prints(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    page = (ROOT / "docs" / "language.md").read_text(encoding="utf-8")
    block = re.search(r"#### PPS301.*?```console\n\$ (ppdsl lint [^\n]*)\n([^\n]*)\n```", page, flags=re.S)
    assert block is not None
    monkeypatch.chdir(ROOT)
    code, out = _printed(block.group(1).split()[1:], capsys)
    assert code == 1 and out.splitlines()[0] == block.group(2)


def test_uneven_ranks_count_each_stage_as_its_share(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Rank 1 holds stages 1 and 2 (1/2 each), rank 0 stage 0 alone (1).
    path = tmp_path / "uneven.pps"
    path.write_text("pipeline ranks=2 microbatches=2 placement=[0,1,1]\n"
                    "rank 0: 0F0 0F1 0B0 0B1\n"
                    "rank 1: 1F0 2F0 2B0 1B0 1F1 2F1 2B1 1B1\n", encoding="utf-8")
    code, out = _printed(["simulate", str(path), "--format", "json"], capsys)
    assert code == 0 and json.loads(out)["peak_memory"] == [2.0, 1.0]
    code, out = _printed(["lint", "--max-memory", "1", str(path)], capsys)
    assert code == 1 and f"rank 0 holds 2 {UNIT}" in out and "rank 1" not in out
