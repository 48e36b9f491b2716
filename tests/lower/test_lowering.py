"""Lowering: for every valid compute-only program, lower() then check() finds nothing.

Random valid programs: a random topological order of the (stage, microbatch) work, cut into
rows by a random placement; forwards and (full or split) backwards, optional overlapped
pairs. Every such program is sound, so its lowering must be clean under all three models,
with no send or receive between stages on one rank and each rank's computes in their order.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from ppdsl.check import check, lower_checked
from ppdsl.ir import Action, Batch, Kind, Program, Step, actions_of
from ppdsl.lower import lower
from ppdsl.memory import peaks_from_codes, profile
from ppdsl.encoding import encode


def random_program(seed: int, ranks: int, stages: int, microbatches: int, split: bool) -> Program:
    rng = random.Random(seed)
    placement = tuple(rng.randrange(ranks) for _ in range(stages))
    # Work items and what each needs.
    needs: dict[tuple[int, Kind, int], list[tuple[int, Kind, int]]] = {}
    for m in range(microbatches):
        for s in range(stages):
            needs[(s, Kind.F, m)] = [(s - 1, Kind.F, m)] if s else []
            grad = Kind.I if split else Kind.B
            needs[(s, grad, m)] = [(s, Kind.F, m)] + ([(s + 1, grad, m)] if s < stages - 1 else [])
            if split:
                needs[(s, Kind.W, m)] = [(s, Kind.I, m)]
    done: set[tuple[int, Kind, int]] = set()
    ready = [w for w, n in needs.items() if not n]
    rows: list[list[Step]] = [[] for _ in range(ranks)]
    waiting = {w: set(n) for w, n in needs.items()}
    users: dict[tuple[int, Kind, int], list[tuple[int, Kind, int]]] = {}
    for w, n in needs.items():
        for x in n:
            users.setdefault(x, []).append(w)
    while ready:
        w = ready.pop(rng.randrange(len(ready)))
        done.add(w)
        rows[placement[w[0]]].append(Action(w[0], w[1], w[2]))
        for u in users.get(w, ()):
            waiting[u].discard(w)
            if not waiting[u]:
                ready.append(u)
    return Program(ranks, stages, microbatches, placement, tuple(map(tuple, rows)))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), ranks=st.integers(1, 4), stages=st.integers(1, 6),
       microbatches=st.integers(1, 4), split=st.booleans(), fuse=st.booleans())
def test_lowering_a_valid_program_checks_clean(seed: int, ranks: int, stages: int, microbatches: int, split: bool,
                                               fuse: bool) -> None:
    program = random_program(seed, ranks, stages, microbatches, split)
    assert [d for d in check(program) if d.is_error] == []
    lowered = lower(program, fuse=fuse, comm_model="grouped" if fuse else "rendezvous")
    for model in ("rendezvous", "grouped", "buffered"):
        assert [d for d in check(lowered, model) if d.is_error] == [], model
    for r, (before, after) in enumerate(zip(program.rows, lowered.rows)):
        computes = [a for s in after for a in actions_of(s) if a.kind.is_compute]
        assert computes == [a for s in before for a in actions_of(s)]
        for s in after:
            for a in actions_of(s):
                if a.kind.is_comm:
                    other = a.stage + (1 if a.kind in (Kind.SEND_F, Kind.RECV_B) else -1)
                    other = a.stage - 1 if a.kind is Kind.RECV_F else other
                    assert program.placement[other] != r, f"local hand-off {a} on rank {r}"
            if fuse and isinstance(s, Batch):
                assert len(s.parts) >= 2


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), ranks=st.integers(1, 3), stages=st.integers(1, 5),
       microbatches=st.integers(1, 4), split=st.booleans(), weighted=st.booleans())
def test_fast_memory_peaks_equal_the_memory_model(seed: int, ranks: int, stages: int, microbatches: int,
                                                   split: bool, weighted: bool) -> None:
    program = random_program(seed, ranks, stages, microbatches, split)
    weights = [1.0 + (s % 3) * 0.5 for s in range(stages)] if weighted else None
    for p in (program, lower(program)):
        fast = peaks_from_codes(encode(p), weights, trusted=True)
        ref = profile(p, weights)
        assert fast == [(float(a), b if a > 0 else None) for a, b in zip(ref.peak, ref.peak_step)]


def test_lowering_refuses_comm_programs_and_broken_ones() -> None:
    import pytest

    from ppdsl.diagnostics import PpsError
    from ppdsl.expansion import parse

    with pytest.raises(PpsError) as exc:
        lower(parse("pipeline ranks=2 microbatches=1\nrank 0: 0F0 0SEND_F0 0RECV_B0 0B0\nrank 1: 1RECV_F0 1F0 1B0 1SEND_B0\n"))
    assert exc.value.diagnostics[0].code == "PPS220"
    cyclic = "pipeline ranks=2 microbatches=2\nrank 0: 0F0 0B0 0F1 0B1\nrank 1: 1F1 1B1 1F0 1B0\n"
    with pytest.raises(PpsError) as exc:  # why it cannot be lowered is the checker's to say
        lower_checked(parse(cyclic))
    assert [d.code for d in exc.value.diagnostics] == ["PPS108"]
    with pytest.raises(PpsError) as exc:  # lowering on its own sees only that the run stops
        lower(parse(cyclic))
    assert [d.code for d in exc.value.diagnostics] == ["PPS220"]
    assert "does not run to the end" in exc.value.diagnostics[0].message


def test_lowering_keeps_overlaps_and_drops_idles() -> None:
    from ppdsl.expansion import parse

    program = parse("pipeline ranks=2 microbatches=2 stages=4 placement=v\n"
                    "rank 0: 0F0 _ 0F1 3F0 3B0 (3F1;0B0) 3B1 0B1\n"
                    "rank 1: 1F0 2F0 1F1 2F1 2B0 1B0 2B1 1B1\n")
    assert [d for d in check(program) if d.is_error] == []
    lowered = lower(program)
    assert check(lowered) == []
    assert not any(type(s).__name__ == "Idle" for row in lowered.rows for s in row)


# A CSV with idle cells: lowering drops them, and its rows stay integers all the same.
IDLE_CSV = "0F0,0F1,,,0B0,0B1\n,1F0,1B0,1F1,1B1\n"
# Stage-only actions (PyTorch's GPipe and 1F1B end each row with REDUCE_GRAD), in rows read
# whole, cell by cell, and (a range in rank 0's row) as steps.
STAGE_ONLY_CSV = "0UNSHARD,0F0,0F1,,,0B0,0B1,0REDUCE_GRAD\n,1F0,1B0,1F1,1B1,1REDUCE_GRAD,1RESHARD\n"
STAGE_ONLY_PPS = ("pipeline ranks=2 microbatches=2\n"
                  "rank 0: 0F{0..1} 0B0 0B1 0REDUCE_GRAD\n"
                  "rank 1: 1F0 1B0 1F1 1B1 1REDUCE_GRAD\n")


def test_lowered_rows_are_kept_as_integers_and_are_the_actions_they_stand_for() -> None:
    from ppdsl.encoding import read_rows
    from ppdsl.formats.torch_csv import read_csv
    from ppdsl.expansion import parse
    from ppdsl.syntax.printer import print_program

    made = [parse("pipeline ranks=4 microbatches=6\nuse interleaved_1f1b(virtual=2)\n"),
            parse("pipeline ranks=3 microbatches=5\nuse zb1p()\n"), read_csv(IDLE_CSV, "idle.csv"),
            read_csv(STAGE_ONLY_CSV, "reduce.csv"), parse(STAGE_ONLY_PPS)]
    for program in made:
        low = lower(program)
        assert read_rows(low) is not None, "the printer and the checker read the integers, no Action made"
        as_steps = low.evolve(rows=tuple(tuple(row) for row in low.rows))  # the same rows, as Action objects
        assert read_rows(as_steps) is None
        assert print_program(low) == print_program(as_steps)
        assert encode(low).codes == encode(as_steps).codes  # the codes lowering kept are those of its rows
        assert check(as_steps) == []
        # What is printed reads back as the same program (a stage-only action with no microbatch).
        assert [a for row in parse(print_program(low)).rows for a in row] == [a for row in as_steps.rows for a in row]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), ranks=st.integers(2, 4), stages=st.integers(2, 6),
       microbatches=st.integers(1, 4), split=st.booleans())
def test_a_receive_comes_just_before_the_compute_that_needs_it(seed: int, ranks: int, stages: int,
                                                               microbatches: int, split: bool) -> None:
    # Exchanges are made when their consumer starts: between a receive and the first compute
    # after it there is only communication, and that compute is what the receive feeds.
    program = random_program(seed, ranks, stages, microbatches, split)
    rows = lower(program).rows
    for row in rows:
        waiting: list[Action] = []
        for step in row:
            members = actions_of(step)
            if all(a.kind.is_comm for a in members):
                waiting += [a for a in members if a.kind in (Kind.RECV_F, Kind.RECV_B)]
                continue
            for r in waiting:
                wanted = {Kind.F} if r.kind is Kind.RECV_F else {Kind.B, Kind.I}
                assert any(a.stage == r.stage and a.microbatch == r.microbatch and a.kind in wanted
                           for a in members), (r, step)
            waiting = []
        assert not waiting


def test_zb1p_at_two_ranks_sends_the_next_forward_before_it_waits_for_a_gradient() -> None:
    from ppdsl.expansion import parse

    rows = [[str(a) for step in row for a in actions_of(step)]
            for row in lower(parse("pipeline ranks=2 microbatches=4\nuse zb1p()\n")).rows]
    # Rank 0 is ahead: it computes and sends F(m+1) before it needs B(m) (for its I(m)), so the
    # last stage finds F(m+1) there when it wants it, and no round trip per microbatch.
    assert rows[0].index("0SEND_F2") < rows[0].index("0RECV_B1") < rows[0].index("0I1")
    assert rows[1].index("1RECV_F2") < rows[1].index("1SEND_B1")
