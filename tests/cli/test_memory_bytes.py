"""Memory in bytes: a profile's sizes, `--max-memory 6GiB`, peak bytes in `simulate`, and a
profile of one shape carried over to another (`cuts.carried`, the search's rule)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ppdsl.cli import main
from ppdsl.cost_sources import load_costs
from ppdsl.cuts import carried
from ppdsl.load import load_program, parse
from ppdsl.memory import Sizes, parse_limit, peak_bytes

ROOT = Path(__file__).resolve().parents[2]
ZBV, ONE_F_ONE_B = str(ROOT / "schedules" / "zbv.pps"), str(ROOT / "schedules" / "1f1b.pps")
# Stage sizes of a 4-stage ZB-V measured at 2 ranks: activations, I-to-W, state (bytes).
ACT, KEPT, STATE = [1000, 2000, 3000, 4000], [100, 200, 300, 400], [10_000, 20_000, 30_000, 40_000]


def _profile(tmp_path: Path, stages: int = 4) -> str:
    actions = [{"rank": 0, "stage": s, "kind": k, "duration": d} for s in range(stages)
               for k, d in (("F", 10), ("I", 10), ("W", 6))]
    data = {"ppdsl_profile": 1, "unit": "us", "stages": stages, "actions": actions,
            "sizes": {"activation": ACT[:stages], "kept": KEPT[:stages], "state": STATE[:stages]}}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_limits_in_bytes_and_in_the_unit() -> None:
    assert parse_limit("6GiB", 1e30).amount == 6 * 2**30 and parse_limit("6GiB", 1e30).in_bytes
    assert parse_limit("1.5GB", 1e30).amount == 1.5e9
    assert parse_limit("100KB", 1e30).amount == 100_000 and parse_limit("512MiB", 1e30).amount == 512 * 2**20
    plain = parse_limit("4", 1e30)
    assert plain.amount == 4 and not plain.in_bytes
    for bad in ("-1GiB", "1.5XB", "nan", "inf", "1e400GiB", "0", "", "GiB"):
        with pytest.raises(ValueError):
            parse_limit(bad, 1e30)


def test_carried_shares_one_cut_or_sums_several() -> None:
    assert carried({0: 4.0, 1: 8.0}, 2, 4) == [2.0, 2.0, 4.0, 4.0]
    assert carried({0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0}, 4, 2) == [3.0, 7.0]
    with pytest.raises(ValueError):
        carried({0: 1.0}, 3, 4)


def test_1f1b_peak_bytes_are_state_and_its_warm_up_forwards(tmp_path: Path) -> None:
    costs = load_costs(_profile(tmp_path), 4)
    assert costs.sizes is not None
    found = peak_bytes(load_program(ONE_F_ONE_B), costs.sizes)
    # Rank r holds 4 - r forwards of its stage at the peak (no split backward: kept plays no part).
    assert found.peak == tuple(STATE[r] + (4 - r) * ACT[r] for r in range(4))


def test_an_i_frees_all_but_what_its_w_needs() -> None:
    program = parse("pipeline ranks=1 microbatches=2\nrank 0: 0F0 0F1 0I0 0I1 0W0 0W1\n")
    sizes = Sizes([1000], [100], [7])
    assert peak_bytes(program, sizes).peak == (7 + 2000,)
    program = parse("pipeline ranks=1 microbatches=2\nrank 0: 0F0 0I0 0F1 0W0 0I1 0W1\n")
    assert peak_bytes(program, sizes).peak == (7 + 1100,)


def test_compare_with_a_profile_of_another_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = _profile(tmp_path)
    assert main(["simulate", ZBV, ONE_F_ONE_B, "--costs", profile]) == 0
    out = capsys.readouterr()
    assert "has errors" not in out.out + out.err and out.err == ""
    header = out.out.splitlines()[0].split()
    assert header == [ZBV, ONE_F_ONE_B]
    assert f"{ZBV}: costs and sizes carried over from the profile's 4 stages to 8 stages, by share of layers" in out.out
    # ZB-V at 4 ranks: 8 stages of half a measured stage each, F 5 us; 1F1B's 4 stages as measured.
    assert "zbv.pps: costs: F=5 I=5 W=3 comm=0 (us)" in out.out and "1f1b.pps: costs: F=10 B=16 comm=0 (us)" in out.out
    peaks = [line for line in out.out.splitlines() if line.startswith("peak bytes (max)")]
    # 1F1B's rank 3 holds the last stage's state and its 4 warm-up forwards: 44,000 bytes.
    assert peaks and peaks[0].split()[-3:] == ["KiB", "43", "KiB"]


def test_simulate_prints_peak_bytes_per_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", ONE_F_ONE_B, "--costs", _profile(tmp_path), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["peak_bytes"] == [STATE[r] + (4 - r) * ACT[r] for r in range(4)]
    assert main(["simulate", ONE_F_ONE_B, "--costs", _profile(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "peak KiB" in out and out.count("in KiB") == 1


def test_a_shape_that_does_not_carry_over_keeps_its_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = _profile(tmp_path, stages=3)
    assert main(["simulate", ZBV, ONE_F_ONE_B, "--costs", profile]) == 1
    out = capsys.readouterr()
    assert out.out.splitlines()[0].split() == [ZBV, ONE_F_ONE_B]
    assert f"{ZBV}: not costed: the profile measured 3 stages; its per-stage costs do not carry over to 8 stages" \
        in out.out
    assert "PPS350" in out.err


def test_lint_in_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = _profile(tmp_path)
    assert main(["lint", ONE_F_ONE_B, "--max-memory", "1MiB", "--costs", profile]) == 0
    assert main(["lint", ONE_F_ONE_B, "--max-memory", "10KB", "--costs", profile]) == 1
    out = capsys.readouterr().out
    assert "rank 0 holds 13.7 KiB at step 3" in out and "over the limit of 9.77 KiB (--max-memory)" in out
    assert main(["lint", ONE_F_ONE_B, "--max-memory", "6GiB"]) == 2
    assert "no profile with sizes is given" in capsys.readouterr().err


@pytest.mark.parametrize("field, value", [("activation", [1, 2]), ("kept", [-1, 0, 0, 0]), ("state", "x"),
                                          ("input", [1, 2]), ("input", [0, -1, 0, 0])])
def test_bad_sizes_are_located_in_the_profile(tmp_path: Path, field: str, value: object,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = Path(_profile(tmp_path))
    data = json.loads(path.read_text())
    data["sizes"][field] = value
    path.write_text(json.dumps(data))
    assert main(["simulate", ONE_F_ONE_B, "--costs", str(path)]) == 1
    assert "PPS352" in capsys.readouterr().err


def test_show_prints_peak_bytes_per_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", ONE_F_ONE_B, "--costs", _profile(tmp_path), "--no-color"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    # Rank r: its stage's state and 4 - r warm-up forwards (1F1B at 4 ranks).
    assert last.startswith("peak memory: rank 0 13.7 KiB, rank 1 25.4 KiB, rank 2 35.2 KiB, rank 3 43 KiB (")
    assert main(["show", ONE_F_ONE_B, "--no-color"]) == 0
    assert "peak memory" not in capsys.readouterr().out
