"""Every checker code has a small failing example, located at the right rank and step."""

from __future__ import annotations

import pytest

from ppdsl.check import RULE_OF_CODE, check
from ppdsl.codes import CODES
from ppdsl.ir import Action, Batch, Kind, Program
from ppdsl.expansion import parse

H2 = "pipeline ranks=2 microbatches=2\n"

# code -> (program text, rank, step, words the message must contain, extra check() arguments)
EXAMPLES: dict[str, tuple[str, int | None, int | None, tuple[str, ...], dict[str, object]]] = {
    "PPS101": ("pipeline ranks=2 microbatches=1 placement=[0,1]\nrank 0: 0F0 1F0 1B0 0B0\nrank 1:\n",
               0, 1, ("`1F0`", "rank 0", "places stage 1 on rank 1"), {}),
    "PPS103": ("pipeline ranks=1 microbatches=2\nrank 0: 0F0 0F1 0B0\n", 0, None, ("microbatch 1", "`0B1`"), {}),
    "PPS104": ("pipeline ranks=1 microbatches=1\nrank 0: 0F0 0F0 0B0\n", 0, 1, ("`0F0`", "again"), {}),
    "PPS105": ("pipeline ranks=1 microbatches=1\nrank 0: 0F0 0I0\n", 0, 1, ("`0I0`", "`0W0`"), {}),
    "PPS106": ("pipeline ranks=1 microbatches=1 mode=inference\nrank 0: 0F0 0B0\n", 0, 1, ("`0B0`", "inference"), {}),
    "PPS107": ("pipeline ranks=1 microbatches=1\nrank 0: 0B0 0F0\n", 0, 0, ("`0B0`", "before", "`0F0`"), {}),
    "PPS108": (H2 + "rank 0: 0F0 0B0 0F1 0B1\nrank 1: 1F1 1B1 1F0 1B0\n", None, None,
               ("dependency cycle", "`0B0`", "needs `1B0`", "runs after"), {}),
    "PPS109": ("pipeline ranks=1 microbatches=1\nrank 0: 0F0 0B0 0R0\n", 0, 2, ("`0R0`", "after `0B0`"), {}),
    "PPS110": ("pipeline ranks=1 microbatches=1\nrank 0: 0F0 0OFFLOAD0 0B0\n", 0, 1, ("`0OFFLOAD0`", "`0RELOAD0`"), {}),
    "PPS111": ("pipeline ranks=1 microbatches=1\nrank 0: 0F0 0OFFLOAD0 0B0 0RELOAD0\n", 0, 2,
               ("`0B0`", "host memory", "`0RELOAD0`"), {}),
    "PPS112": ("pipeline ranks=1 microbatches=1\nrank 0: 0UNSHARD 0F0 0RESHARD 0B0\n", 0, 3,
               ("`0B0`", "after `0RESHARD` freed them"), {}),
    "PPS113": ("pipeline ranks=1 microbatches=2\nrank 0: 0F0 0F1 0B0 0REDUCE_GRAD 0B1\n", 0, 3,
               ("`0REDUCE_GRAD`", "before `0B1`"), {}),
    "PPS201": ("pipeline ranks=2 microbatches=1\nrank 0: 0F0 0SEND_F0 0RECV_B0 0B0\nrank 1: 1F0 1B0 1SEND_B0\n",
               0, 1, ("`0SEND_F0`", "`1RECV_F0`", "rank 1"), {}),
    "PPS202": ("pipeline ranks=2 microbatches=1\nrank 0: 0F0 0RECV_B0 0B0\nrank 1: 1RECV_F0 1F0 1B0 1SEND_B0\n",
               1, 0, ("`1RECV_F0`", "`0SEND_F0`"), {}),
    "PPS203": ("pipeline ranks=2 microbatches=1\nrank 0: 0F0 0SEND_F0 0SEND_F0 0RECV_B0 0B0\n"
               "rank 1: 1RECV_F0 1F0 1B0 1SEND_B0\n", 0, 2, ("`0SEND_F0`", "again"), {}),
    "PPS204": ("pipeline ranks=1 microbatches=1 stages=2\nrank 0: 0F0 0SEND_F0 1RECV_F0 1F0 1B0 0B0\n",
               0, 1, ("`0SEND_F0`", "both on rank 0"), {}),
    "PPS205": ("pipeline ranks=2 microbatches=1\nrank 0: 0SEND_F0 0F0 0RECV_B0 0B0\nrank 1: 1RECV_F0 1F0 1B0 1SEND_B0\n",
               0, 0, ("`0SEND_F0`", "`0F0`", "later"), {}),
    "PPS206": ("pipeline ranks=2 microbatches=1\nrank 0: 0F0 0SEND_F0 0RECV_B0 0B0\nrank 1: 1F0 1RECV_F0 1B0 1SEND_B0\n",
               1, 0, ("`1F0`", "before", "`1RECV_F0`"), {}),
    "PPS207": ("pipeline ranks=2 microbatches=1\nrank 0: 0F0 0SEND_F0 0RECV_B0 0B0 0SEND_B0\n"
               "rank 1: 1RECV_F0 1F0 1B0 1SEND_B0\n", 0, 4, ("`0SEND_B0`", "before stage 0"), {}),
    "PPS210": (H2 + "rank 0: 0F0 0SEND_F0 0F1 <0SEND_F1 0RECV_B0> 0B0 0RECV_B1 0B1\n"
               "rank 1: 1RECV_F0 1F0 1B0 <1SEND_B0 1RECV_F1> 1F1 1B1 1SEND_B1\n", 0, 3,
               ("rank 0 waits at step 3 `0SEND_F1` for rank 1", "which waits at step 3 `1SEND_B0` for rank 0"), {}),
    "PPS212": (H2 + "rank 0: 0F0 0F1 0SEND_F1 0SEND_F0 0RECV_B0 0B0 0RECV_B1 0B1\n"
               "rank 1: 1RECV_F0 1RECV_F1 1F0 1B0 1SEND_B0 1F1 1B1 1SEND_B1\n", 1, 0,
               ("out of order", "`0SEND_F1`", "`1RECV_F0`", "microbatch 0 of stage 1"), {}),
    "PPS301": ("pipeline ranks=1 microbatches=4 memory=2\nrank 0: 0F0 0F1 0F2 0B0 0B1 0B2 0F3 0B3\n", 0, 2,
               ("rank 0", "3 microbatches of a rank's activations", "step 2", "limit of 2"), {}),
    "PPS302": ("pipeline ranks=1 microbatches=1\nrank 0: 0F0 0B0\n", None, None, ("2 memory weights", "1 stage"),
               {"memory_weights": [1.0, 2.0]}),
    "PPS401": ("pipeline ranks=1 microbatches=3\nrank 0: 0F1 0F0 0F2 0B0 0B1 0B2\n", 0, 1, ("`0F0` comes after `0F1`",), {}),
    "PPS402": ("pipeline ranks=2 microbatches=1 stages=1 placement=[0]\nrank 0: 0F0 0B0\nrank 1: _\n", 1, None,
               ("rank 1 has no work",), {}),
    "PPS403": ("pipeline ranks=1 microbatches=1\nrank 0: 0F0 0B0 _ _\n", 0, 2, ("2 idle steps",), {}),
}


@pytest.mark.parametrize("code", sorted(EXAMPLES))
def test_each_code_has_a_failing_example(code: str) -> None:
    text, rank, step, words, kwargs = EXAMPLES[code]
    program = parse(text, "example.pps")
    found = [d for d in check(program, **kwargs) if d.code == code]  # type: ignore[arg-type]
    assert found, f"{code} not reported; got {[(d.code, d.message) for d in check(program, **kwargs)]}"  # type: ignore[arg-type]
    d = found[0]
    for w in words:
        assert w in d.message, (w, d.message)
    assert d.path == "example.pps"
    if rank is not None:
        assert d.rank == rank
    if step is not None:
        assert d.step == step
        # The column points at the step's token in its row.
        line = text.splitlines()[d.line - 1]
        token = line[d.column - 1:].split()[0]
        assert token.startswith(("<", "(")) or token.lstrip("<") == str(_step_text(program, d.rank, step)), (token, d)
    assert d.is_error == (code < "PPS400")


def _step_text(program: Program, rank: int | None, step: int) -> str:
    assert rank is not None
    return str(program.rows[rank][step])


def test_api_only_codes() -> None:
    """PPS102 and PPS208 concern programs built through the API (the parser refuses them)."""
    bad_range = Program(1, 1, 1, (0,), ((Action(0, Kind.F, 0), Action(0, Kind.F, 5), Action(0, Kind.B, 0)),))
    assert "PPS102" in {d.code for d in check(bad_range)}
    bad_rows = Program(2, 1, 1, (0,), ((Action(0, Kind.F, 0), Action(0, Kind.B, 0)),))
    assert "PPS102" in {d.code for d in check(bad_rows)}
    bad_batch = Program(1, 1, 1, (0,), ((Action(0, Kind.F, 0), Batch((Action(0, Kind.B, 0),))),))
    assert "PPS208" in {d.code for d in check(bad_batch)}


def test_stuck_without_cycle_is_pps211() -> None:
    # Rank 0 waits at `0W0` for `0I0`, which no rank runs: a wait with no cycle (not PPS108
    # or PPS210), the case PPS211 names.
    from ppdsl.check.context import Context
    from ppdsl.check import deadlock
    from ppdsl.semantics import CommModel

    program = parse("pipeline ranks=1 microbatches=1\nrank 0: 0W0 0F0 0B0\n")
    # W with no I at all: completeness would stop here (PPS105); run the deadlock family alone.
    ctx = Context(program, CommModel.RENDEZVOUS, None, None)
    found = [(d.code, d.message, d.rank, d.step) for d in deadlock.check(ctx)]
    assert found == [("PPS211", "rank 0 waits forever at step 0 `0W0` for `0I0`, which no rank runs", 0, 0)]


def test_every_checker_code_is_explained_and_registered() -> None:
    mine = [c for c in CODES if "PPS100" < c < "PPS500" and not c.startswith("PPS35")]
    for code in mine:
        if code == "PPS220":
            continue  # lowering's refusal, documented in lower.py and docs/checks.md
        rule = RULE_OF_CODE.get(code)
        assert rule is not None and rule.__doc__ is not None and code in rule.__doc__, code


@pytest.mark.parametrize("row, column, help_starts", [
    # The last backward is missing: it belongs after the stage's previous backward, the end here.
    ("0F0 0F1 0F2 0B0 0F3 0B1 0B2", 33, "add `0B3` after `0B2` (step 6) in rank 0's row"),
    ("0F0 0F1 0F3 0B0 0B1 0B2 0B3", 13, "add `0F2` after `0F1` (step 1) in rank 0's row"),
    ("0F0 0F1 0F2 0F3 0B1 0B2 0B3", 25, "add `0B0` before `0B1` (step 4) in rank 0's row"),
])
def test_a_missing_action_is_located_where_it_belongs(row: str, column: int, help_starts: str) -> None:
    text = f"pipeline ranks=1 microbatches=4\nrank 0: {row}\n"
    (d,) = [d for d in check(parse(text, "m.pps")) if d.code == "PPS103"]
    assert (d.line, d.column) == (2, column)
    assert d.help is not None and d.help.startswith(help_starts), d.help


# PyTorch 2.13's Schedule1F1B order for 4 ranks x 8 microbatches, as `_get_pipeline_order()`
# gives it: the last rank runs `3F1 .. 3F8` where `3F0 .. 3F7` belong.
TORCH_1F1B_ORDER = """\
0F0,0F1,0F2,0F3,0B0,0F4,0B1,0F5,0B2,0F6,0B3,0F7,0B4,0B5,0B6,0B7,0REDUCE_GRAD
1F0,1F1,1F2,1B0,1F3,1B1,1F4,1B2,1F5,1B3,1F6,1B4,1F7,1B5,1B6,1B7,1REDUCE_GRAD
2F0,2F1,2B0,2F2,2B1,2F3,2B2,2F4,2B3,2F5,2B4,2F6,2B5,2F7,2B6,2B7,2REDUCE_GRAD
3F1,3B0,3F2,3B1,3F3,3B2,3F4,3B3,3F5,3B4,3F6,3B5,3F7,3B6,3F8,3B7,3REDUCE_GRAD
"""


def test_a_csv_microbatch_one_past_the_rest_is_told_once() -> None:
    from ppdsl.formats.torch_csv import read_csv

    found = [(d.code, d.line, d.column, d.message) for d in check(read_csv(TORCH_1F1B_ORDER, "s1.csv"))]
    assert found == [
        ("PPS103", 4, 1, "stage 3 (rank 3) has no forward for microbatch 0 (`3F0`)"),
        ("PPS103", 4, 57, "`3F8` is of microbatch 8, which stages {0..2} have no action of: this CSV's "
                          "microbatch count, 9, is read from its largest microbatch"),
    ]
    # Where the header gives the count, a missing microbatch is told stage by stage, as ever.
    pps = "pipeline ranks=2 microbatches=3\nrank 0: 0F0 0F1 0B0 0B1\nrank 1: 1F0 1F1 1F2 1B0 1B1 1B2\n"
    assert [d.message.rsplit(" (", 1)[0] for d in check(parse(pps, "m.pps")) if d.code == "PPS103"] == [
        "stage 0 (rank 0) has no forward for microbatch 2", "stage 0 (rank 0) has no backward for microbatch 2"]
    # Half the stages or more with the last microbatch: the others lack it.
    half = "0F0,0B0\n1F0,1F1,1B0,1B1\n"
    assert [d.message.rsplit(" (", 1)[0] for d in check(read_csv(half, "h.csv")) if d.code == "PPS103"] == [
        "stage 0 (rank 0) has no forward for microbatch 1", "stage 0 (rank 0) has no backward for microbatch 1"]


def test_language_md_shows_the_stray_microbatch_as_lint_reports_it() -> None:
    import re
    from pathlib import Path

    from ppdsl.formats.torch_csv import read_csv

    page = (Path(__file__).resolve().parents[2] / "docs" / "language.md").read_text(encoding="utf-8")
    block = re.search(r"#### PPS103.*?```text\n(.*?)```", page, flags=re.S)
    assert block is not None
    found = [f"{d.path}:{d.line}:{d.column}: error[{d.code}]: {d.message}"
             for d in check(read_csv(TORCH_1F1B_ORDER, "s1.csv"))]
    assert block.group(1).splitlines() == found
