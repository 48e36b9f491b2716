"""Invalid parameters give a located error that states the constraint with its numbers."""

from __future__ import annotations

import pytest

from ppdsl import parse
from ppdsl.diagnostics import PpsError
from ppdsl.generators import registry


def _error(text: str) -> tuple[str, str, int, int]:
    with pytest.raises(PpsError) as info:
        parse(text, "t.pps")
    d = info.value.diagnostics[0]
    return d.code, d.message, d.line, d.column


def test_dualpipev_needs_2p_microbatches() -> None:
    code, message, line, column = _error("pipeline ranks=4 microbatches=7\nuse dualpipev()\n")
    assert code == "PPS022" and line == 2 and column == 5
    assert "7 microbatches < 2 x 4 ranks = 8" in message


def test_vpp_states_the_round_rule() -> None:
    code, message, line, _ = _error("pipeline ranks=4 microbatches=9\nuse vpp(virtual=2)\n")
    assert code == "PPS022" and line == 2
    assert "max(1, 9 // 4) = 2 rounds" in message and "not a multiple of 2" in message


@pytest.mark.parametrize("m", [1, 3, 4, 5, 6, 7, 8, 10, 12, 15, 16, 20])
def test_vpp_accepts_scheduleVPP_counts(m: int) -> None:
    program = parse(f"pipeline ranks=4 microbatches={m}\nuse vpp(virtual=2)\n")
    assert program.stages == 8


@pytest.mark.parametrize("m", [9, 11, 13, 14, 17, 18, 19])
def test_vpp_refuses_what_scheduleVPP_refuses(m: int) -> None:
    # rounds = max(1, m // 4); ScheduleVPP raises unless m % rounds == 0
    with pytest.raises(registry.GeneratorError) as info:
        registry.expand("vpp", 4, m, {})
    err = info.value
    rounds = max(1, m // 4)
    assert err.code == "PPS022"
    assert f"{m} microbatches are not a multiple of {rounds}" in err.message
    # The counts the help offers are ones the generator takes.
    assert err.help is not None and "e.g. " in err.help
    offered = [int(n) for n in err.help.split("e.g. ")[1].split(", ")]
    assert offered and m not in offered
    for n in offered:
        registry.expand("vpp", 4, n, {})


def test_virtual_below_one_points_at_the_argument() -> None:
    code, message, line, column = _error("pipeline ranks=4 microbatches=8\nuse looped_bfs(virtual=0)\n")
    assert code == "PPS022" and (line, column) == (2, 16)
    assert "at least 1" in message


def test_unknown_generator_suggests() -> None:
    with pytest.raises(PpsError) as info:
        parse("pipeline ranks=4 microbatches=8\nuse zvb()\n", "t.pps")
    (d,) = info.value.diagnostics
    assert d.code == "PPS020" and d.help is not None and d.help.startswith("did you mean `zbv`? ")


def test_a_misspelt_argument_is_suggested() -> None:
    with pytest.raises(PpsError) as info:
        parse("pipeline ranks=4 microbatches=8\nuse interleaved_1f1b(virtul=2)\n", "t.pps")
    (d,) = info.value.diagnostics
    assert d.code == "PPS021" and d.help is not None and d.help.startswith("did you mean `virtual`? ")


def test_aliases() -> None:
    assert registry.canonical_name("vpp") == "interleaved_1f1b"
    assert registry.canonical_name("fthenb") == "gpipe"
    assert set(registry.REGISTRY) == {"gpipe", "1f1b", "interleaved_1f1b", "looped_bfs", "zb1p", "zb2p",
                                      "zbv", "v_half", "v_min", "dualpipev", "pipeoffload"}


def test_inference_keeps_forwards_only() -> None:
    program = parse("pipeline ranks=4 microbatches=8 mode=inference\nuse zbv()\n")
    assert all(a.kind.name == "F" for _, _, a in program.actions())
    assert program.action_count == 8 * 8


def test_interleaved_benchmark_size_is_fast() -> None:
    # This process's CPU time, not the wall clock: other work on a shared machine must not fail it.
    # A bound that only catches a blow-up (quadratic work would take minutes); speed is benchmarked.
    import time
    start = time.process_time()
    built = registry.expand("vpp", 64, 1024, {"virtual": 2})
    assert sum(len(r) for r in built.rows) == 64 * 1024 * 2 * 2
    assert time.process_time() - start < 10.0
