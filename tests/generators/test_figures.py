"""Published bubble and memory figures, under unit costs (F = I = W = 1, B = 2)."""

from __future__ import annotations

import pytest

from gen_helpers import build, measure, rank_span_idle
from ppdsl.memory import profile


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 1), (4, 8), (4, 3), (8, 16), (8, 64), (16, 32)])
def test_gpipe_and_1f1b_bubble(name: str, p: int, m: int) -> None:
    _, bubble, _ = measure(build(name, p, m))
    assert bubble == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize("p,m", [(4, 8), (4, 3), (8, 16), (8, 5)])
def test_memory_gpipe_m_and_1f1b_min_p_minus_r_m(p: int, m: int) -> None:
    assert profile(build("gpipe", p, m)).peak == tuple(float(m) for _ in range(p))
    assert profile(build("1f1b", p, m)).peak == tuple(float(min(p - r, m)) for r in range(p))


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 16, 2), (8, 32, 4), (8, 16, 3), (4, 10, 2), (16, 64, 2)])
def test_interleaved_bubble_is_p_minus_1_over_v_m_of_ideal(p: int, m: int, v: int) -> None:
    makespan, bubble, _ = measure(build("interleaved_1f1b", p, m, virtual=v))
    ideal = 3 * m  # each rank's compute per microbatch: F + B of its share of the model, over v chunks
    # idle time per rank over ideal time: (p-1)/(v*m)
    assert (makespan - ideal) / ideal == pytest.approx((p - 1) / (v * m))
    assert bubble == pytest.approx((p - 1) / (v * m + p - 1))


def test_interleaved_beats_1f1b() -> None:
    assert measure(build("vpp", 8, 32, virtual=4))[1] < measure(build("1f1b", 8, 32))[1] / 3


@pytest.mark.parametrize("p,m", [(4, 8), (4, 16), (8, 32), (8, 64), (16, 64)])
def test_zb1p_bubble_is_a_third_of_1f1b_at_1f1b_peak(p: int, m: int) -> None:
    one_f_one_b_idle = 3 * (p - 1)  # per rank, F + I + W per microbatch
    makespan, bubble, peak = measure(build("zb1p", p, m))
    assert makespan - 3 * m == one_f_one_b_idle / 3
    assert bubble == pytest.approx((p - 1) / (3 * m + p - 1))
    assert max(peak) == max(profile(build("1f1b", p, m)).peak) == p


@pytest.mark.parametrize("p,m", [(4, 8), (4, 16), (8, 32), (8, 64), (16, 64)])
def test_zb2p_no_idle_inside_any_rank_and_2p_memory(p: int, m: int) -> None:
    program = build("zb2p", p, m)
    assert rank_span_idle(program) == [0.0] * p
    # What remains is the parallelogram's skew: rank r starts r steps late.
    _, bubble, peak = measure(program)
    assert bubble == pytest.approx((p - 1) / (3 * m + p - 1))
    assert max(peak) == 2 * p


@pytest.mark.parametrize("p,m", [(4, 8), (4, 16), (8, 32), (8, 64), (16, 64)])
def test_zbv_zero_bubble_at_1f1b_memory(p: int, m: int) -> None:
    program = build("zbv", p, m)
    assert rank_span_idle(program) == [0.0] * p
    _, bubble, _ = measure(program)
    assert bubble == pytest.approx((p - 1) / (6 * m + p - 1))  # the skew only
    # Two half-size stages per rank: 2p chunk activations = p whole-rank microbatches.
    assert max(profile(program).peak) == p


@pytest.mark.parametrize("p", [4, 6, 8, 16])
def test_v_half_and_v_min_memory(p: int) -> None:
    m = 4 * p
    base = max(profile(build("1f1b", p, m)).peak)
    half = max(profile(build("v_half", p, m)).peak)
    third = max(profile(build("v_min", p, m)).peak)
    assert half == (p + 2) // 2  # the paper's V-Half figure
    assert third == (p + 4) // 3  # the paper's V-Min figure
    assert half <= base / 2 + 1
    assert third <= base / 3 + 2


@pytest.mark.parametrize("p", [4, 8])
def test_v_half_bubble_at_most_1f1b(p: int) -> None:
    m = 4 * p
    assert measure(build("v_half", p, m))[1] <= measure(build("1f1b", p, m))[1]


def test_looped_bfs_holds_everything() -> None:
    assert profile(build("looped_bfs", 4, 8, virtual=2)).peak == (8.0,) * 4  # m microbatches of a rank's activations


# The paper's authors' own V-Half / V-Min generators, at unit cost per chunk (F = I = W = 1 for
# one chunk, i.e. 2 for a rank's share): the makespans our v_half / v_min must not exceed.
AUTHORS = {"v_half": {(4, 8): 53, (4, 16): 101, (8, 16): 113, (8, 32): 209},
           "v_min": {(4, 8): 59, (4, 16): 107, (8, 16): 123, (8, 32): 219}}


@pytest.mark.parametrize("name,p,m", [(n, p, m) for n, sizes in AUTHORS.items() for p, m in sizes])
def test_v_half_and_v_min_as_short_as_the_authors_at_their_memory(name: str, p: int, m: int) -> None:
    makespan, _, _ = measure(build(name, p, m))
    assert 2 * makespan <= AUTHORS[name][(p, m)]  # our default F=1 a rank is 0.5 a chunk
    budget = (p + 2) // 2 if name == "v_half" else (p + 4) // 3
    assert max(profile(build(name, p, m)).peak) == budget


@pytest.mark.parametrize("name", ["v_half", "v_min"])
@pytest.mark.parametrize("p", [2, 3, 4, 5, 6, 8, 12, 16])
def test_v_half_and_v_min_bubble_never_above_1f1b(name: str, p: int) -> None:
    for m in (1, 2, p - 1, p, 2 * p, 4 * p):
        if m >= 1:
            assert measure(build(name, p, m))[1] <= measure(build("1f1b", p, m))[1] + 1e-12, (p, m)
