"""The proofs in `ppdsl/proofs.py` answer True only for programs the engine's loop runs to the end.

`rows_carry_their_inputs` (a program with sends and receives whose rows carry their own
inputs, its pairs walked) is compared with the loop itself on lowered programs of every
generator and on random breakages of them: operations swapped, moved, dropped or repeated,
which leave some programs stuck (deadlocks the walk must not prove) and some still running.
"""

from __future__ import annotations

import random

import pytest

from ppdsl.encoding import encode
from ppdsl.expansion import parse
from ppdsl.ir import Program, Step
from ppdsl.lower import lower
from ppdsl.proofs import pairs_meet, rows_carry_their_inputs
from ppdsl.semantics import UNIT, CommModel, _Engine, completes, execute

CALLS = ["1f1b()", "gpipe()", "interleaved_1f1b(virtual=2)", "zb1p()", "v_half()", "dualpipev()"]


def the_loop(p: Program, model: CommModel = CommModel.RENDEZVOUS) -> bool:
    """The engine's own verdict, by its loop, with no proof asked first."""
    return _Engine(p, encode(p), model, UNIT)._loop(False) is True


def broken(p: Program, rng: random.Random, n: int) -> list[Program]:
    out = []
    for _ in range(n):
        rows: list[list[Step]] = [list(row) for row in p.rows]
        r = rng.randrange(len(rows))
        j = rng.randrange(len(rows[r]))
        move = rng.randrange(4)
        if move == 0 and j + 1 < len(rows[r]):  # two neighbours swapped: the usual deadlock
            rows[r][j], rows[r][j + 1] = rows[r][j + 1], rows[r][j]
        elif move == 1:
            rows[r].insert(rng.randrange(len(rows[r]) + 1), rows[r].pop(j))
        elif move == 2:
            rows[r].pop(j)
        else:
            rows[r].insert(rng.randrange(len(rows[r]) + 1), rows[r][j])
        out.append(p.evolve(rows=tuple(map(tuple, rows)), source=None))
    return out


@pytest.mark.parametrize("call", CALLS)
def test_the_walk_proves_only_what_the_loop_runs_to_the_end(call: str) -> None:
    base = lower(parse(f"pipeline ranks=4 microbatches=8\nuse {call}\n"))
    proven = fallen_back = stuck = 0
    for n, p in enumerate([base, *broken(base, random.Random(call), 60)]):
        enc = encode(p)
        by_rows = rows_carry_their_inputs(enc, enc.needs(False))
        runs = the_loop(p)
        if n == 0 and call != "dualpipev()":  # its overlapped pairs keep it on the loop
            assert by_rows, "a lowered program carries its inputs in its rows"
        if by_rows:
            assert runs, "the walk proved a program the loop does not run to the end"
        assert completes(p) == runs == execute(p).completed
        assert completes(p, "grouped") == the_loop(p, CommModel.GROUPED)
        proven += by_rows
        fallen_back += runs and not by_rows
        stuck += not runs
    if call != "dualpipev()":
        assert proven > 1 and stuck, (proven, fallen_back, stuck)


def test_the_walk_agrees_with_the_loop_past_256_ranks() -> None:
    # Who waits where is kept one byte a code up to 255 ranks, in a wider table past that.
    base = lower(parse("pipeline ranks=300 microbatches=2\nuse 1f1b()\n"))
    enc = encode(base)
    assert rows_carry_their_inputs(enc, enc.needs(False)) and the_loop(base)
    verdicts = set()
    for p in broken(base, random.Random(300), 12):
        enc = encode(p)
        runs = the_loop(p)
        if rows_carry_their_inputs(enc, enc.needs(False)):
            assert runs
            verdicts.add(True)
        verdicts.add(runs)
    assert verdicts == {True, False}
    # Rank 0 waits for the first gradient before it sends the second forward, which rank 1
    # waits for first: every input is in its own row, and the walk finds the pair that never meets.
    rows = [list(row) for row in base.rows]
    names = [str(step) for step in rows[0]]
    j = names.index("0SEND_F1")
    assert names[j + 1] == "0RECV_B0"
    rows[0][j], rows[0][j + 1] = rows[0][j + 1], rows[0][j]
    stuck = base.evolve(rows=tuple(map(tuple, rows)), source=None)
    assert not pairs_meet(encode(stuck)) and not the_loop(stuck)


def test_a_deadlock_is_not_proven() -> None:
    p = parse("pipeline ranks=2 microbatches=1\n"
              "rank 0: 0F0 0SEND_F0 0RECV_B0 0B0\n"
              "rank 1: 1RECV_F0 1F0 1B0 1SEND_B0\n")
    enc = encode(p)
    assert rows_carry_their_inputs(enc, enc.needs(False)) and completes(p)
    # Rank 0 sends its second forward before it receives the first gradient, which rank 1
    # sends before it receives that forward: under rendezvous both sends wait for good.
    q = parse("pipeline ranks=2 microbatches=2\n"
              "rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1\n"
              "rank 1: 1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1\n")
    assert not rows_carry_their_inputs(encode(q), encode(q).needs(False))
    assert not completes(q) and not the_loop(q)
    # The same with rank 1 receiving the second forward first: it runs, and is proven.
    ok = parse("pipeline ranks=2 microbatches=2\n"
               "rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1\n"
               "rank 1: 1RECV_F0 1F0 1RECV_F1 1B0 1SEND_B0 1F1 1B1 1SEND_B1\n")
    assert rows_carry_their_inputs(encode(ok), encode(ok).needs(False)) and the_loop(ok)


def test_an_input_from_a_later_place_or_another_rank_is_left_to_the_loop() -> None:
    # 1F0 before the receive that brings its input: the loop waits for data there.
    p = parse("pipeline ranks=2 microbatches=1\n"
              "rank 0: 0F0 0SEND_F0 0RECV_B0 0B0\n"
              "rank 1: 1F0 1RECV_F0 1B0 1SEND_B0\n")
    enc = encode(p)
    assert not rows_carry_their_inputs(enc, enc.needs(False))
    assert completes(p) == the_loop(p) is False
    # Buffered answers nothing here (the loop decides).
    assert not rows_carry_their_inputs(enc, enc.needs(True))


def test_the_walk_agrees_with_the_loop_past_the_pipeline_s_ends_and_beside_stage_only_actions() -> None:
    """`pairs_meet` works out each peer from the labels: a send or receive naming a stage
    outside the pipeline (PPS207) meets nothing, and stage-only actions (which the walk steps
    over) change nothing; in each case its verdict is the loop's."""
    ok = "rank 0: 0F0 0SEND_F0 0RECV_B0 0B0\nrank 1: 1RECV_F0 1F0 1B0 1SEND_B0\n"
    head = "pipeline ranks=2 microbatches=1\n"
    assert pairs_meet(encode(parse(head + ok))) and the_loop(parse(head + ok))
    for edge in ("rank 1: 1RECV_F0 1F0 1SEND_F0 1B0 1SEND_B0\n",   # to stage 2, past the last
                 "rank 1: 1RECV_F0 1F0 1B0 1RECV_B0 1SEND_B0\n"):  # from stage 2
        p = parse(head + ok.splitlines(keepends=True)[0] + edge)
        assert not pairs_meet(encode(p)) and not the_loop(p)
    for edge in ("rank 0: 0RECV_F0 0F0 0SEND_F0 0RECV_B0 0B0\n",   # from stage -1
                 "rank 0: 0F0 0SEND_F0 0RECV_B0 0B0 0SEND_B0\n"):  # to stage -1
        p = parse(head + edge + ok.splitlines(keepends=True)[1])
        assert not pairs_meet(encode(p)) and not the_loop(p)
    # Microbatch 1 of stage 2 lies past every code of the pipeline, microbatch 1 of stage -1 before.
    two = "pipeline ranks=2 microbatches=2\n"
    for rows in ("rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1\n"
                 "rank 1: 1RECV_F0 1F0 1RECV_F1 1F1 1SEND_F1 1B0 1SEND_B0 1B1 1SEND_B1\n",
                 "rank 0: 0RECV_F1 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1\n"
                 "rank 1: 1RECV_F0 1F0 1RECV_F1 1F1 1B0 1SEND_B0 1B1 1SEND_B1\n"):
        p = parse(two + rows)
        assert not pairs_meet(encode(p)) and not the_loop(p)
    staged = parse(head + "rank 0: 0UNSHARD 0F0 0SEND_F0 0RECV_B0 0B0 0REDUCE_GRAD\n"
                          "rank 1: 1UNSHARD 1RECV_F0 1F0 1B0 1SEND_B0 1RESHARD\n")
    assert pairs_meet(encode(staged)) and the_loop(staged)
    stuck = parse(head + "rank 0: 0UNSHARD 0F0 0RECV_B0 0SEND_F0 0B0\n"
                         "rank 1: 1UNSHARD 1RECV_F0 1F0 1B0 1SEND_B0\n")
    assert not pairs_meet(encode(stuck)) and not the_loop(stuck)
