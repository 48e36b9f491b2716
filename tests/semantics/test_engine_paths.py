"""The engine's fast paths agree with the engine itself.

`semantics.completes` (the checker's run-to-the-end question) is the verdict of the one
unit-time run that `execute` keeps on the program, also where a compute-only timeline's
steps answer it without the loop (`steps_are_an_order`), and `Timing.from_table` (durations the
engine reads as numbers) must give the same timeline as the same durations given as
callbacks, compared on generated programs, their lowered and fused forms, and random
breakages of them (dropped, duplicated, moved actions), under every communication model.
A grouped batch, whose members are posted by the same send/receive code as single
operations, is checked against times worked out by hand.
"""

from __future__ import annotations

import random

import pytest

from ppdsl.encoding import encode
from ppdsl.ir import IDLE, Action, Kind, Program, Step
from ppdsl.lower import lower
from ppdsl.semantics import MODELS, Timing, completes, execute, steps_are_an_order
from ppdsl.expansion import parse

CALLS = ["1f1b()", "gpipe()", "interleaved_1f1b(virtual=2)", "zb1p()", "dualpipev()", "v_half()"]


def programs(call: str) -> list[Program]:
    base = parse(f"pipeline ranks=4 microbatches=8\nuse {call}\n")
    out = [base, lower(base), lower(base, fuse=True, comm_model="grouped")]
    rng = random.Random(call)
    for p in list(out):
        for _ in range(12):
            rows: list[list[Step]] = [list(row) for row in p.rows]
            r = rng.randrange(len(rows))
            j = rng.randrange(len(rows[r]))
            move = rng.randrange(3)
            if move == 0:
                rows[r].pop(j)
            elif move == 1:
                rows[r].insert(rng.randrange(len(rows[r]) + 1), rows[r][j])
            else:
                rows[r].insert(rng.randrange(len(rows[r]) + 1), rows[r].pop(j))
            out.append(p.evolve(rows=tuple(map(tuple, rows)), source=None))
    return out


def timeline(p: Program) -> Program:
    """`p` written one cell per unit of time, as PyTorch writes its CSV: each step in the
    column where its unit-time run starts it, idle cells between."""
    run = execute(p.evolve(source=None))
    rows: list[tuple[Step, ...]] = []
    for row, starts in zip(p.rows, run.starts):
        cells: list[Step] = [IDLE] * (int(max(starts, default=-1) or 0) + 1)  # type: ignore[type-var, arg-type]
        for step, t in zip(row, starts):
            assert t is not None and t == int(t)
            cells[int(t)] = step
        rows.append(tuple(cells))
    return p.evolve(rows=tuple(rows), source=None)


def timelines(call: str) -> list[Program]:
    """A generated compute-only program as a timeline, and random changes of it: an idle
    column added to every row (still a timeline), actions moved, dropped or repeated (also in
an idle cell, the rest unmoved), a row's
    idle cells taken out (the steps then no longer time the dependencies, while the program
    may still run)."""
    base = timeline(parse(f"pipeline ranks=4 microbatches=8\nuse {call}\n"))
    out = [base]
    rng = random.Random("timeline " + call)
    for _ in range(30):
        rows: list[list[Step]] = [list(row) for row in base.rows]
        r = rng.randrange(len(rows))
        busy = [j for j, st in enumerate(rows[r]) if st is not IDLE]
        j = rng.choice(busy)
        move = rng.randrange(6)
        idle = [i for i, st in enumerate(rows[r]) if st is IDLE]
        if move == 5 and idle:  # an action repeated in an idle cell, the other cells unmoved
            rows[r][rng.choice(idle)] = rows[r][j]
        elif move == 4:  # an idle column in every row: still a timeline
            at = rng.randrange(max(map(len, rows)))
            rows = [row[:at] + [IDLE] + row[at:] for row in rows]
        elif move == 0:
            rows[r][j] = IDLE
        elif move == 1:
            rows[r].insert(rng.randrange(len(rows[r]) + 1), rows[r][j])
        elif move == 2:
            rows[r].insert(rng.randrange(len(rows[r]) + 1), rows[r].pop(j))
        else:
            rows[r] = [st for st in rows[r] if st is not IDLE] + [IDLE]
        out.append(base.evolve(rows=tuple(map(tuple, rows)), source=None))
    return out


@pytest.mark.parametrize("call", CALLS)
def test_a_timeline_s_steps_prove_it_runs_only_when_it_does(call: str) -> None:
    proven = fallen_back = stuck = 0
    for n, p in enumerate(timelines(call)):
        enc = encode(p)
        by_steps = steps_are_an_order(enc, enc.needs(False)) if not any(enc.groups) else False
        if n == 0 and call != "dualpipev()":
            assert by_steps, "a unit-time run's own timeline is proven by its steps"
        for model in MODELS:
            finished = completes(p, model)
            assert finished == execute(p, model).completed
            if by_steps:
                assert finished, "the steps proved a program that does not run to the end"
        proven += by_steps
        fallen_back += finished and not by_steps
        stuck += not finished
    if call != "dualpipev()":  # its overlapped pairs keep it on the loop
        assert proven > 1, "the timeline and its extra idle columns should be proven by their steps"
    assert fallen_back and stuck, (proven, fallen_back, stuck)


def as_csv(p: Program) -> str:
    """A compute-only program's rows as PyTorch's CSV (an empty cell for an idle step)."""
    return "".join(",".join("" if st is IDLE else str(st) for st in row) + "\n" for row in p.rows)


@pytest.mark.parametrize("call", [c for c in CALLS if c != "dualpipev()"])
def test_a_timeline_read_from_a_csv_is_proven_as_its_steps_say(call: str) -> None:
    # The reader keeps such rows as integers (`codes_from_reader`): the same verdicts.
    from ppdsl.formats.torch_csv import read_csv

    for p in timelines(call)[:12]:
        q = read_csv(as_csv(p))
        enc = encode(q)
        assert enc.steps == encode(p).steps and enc.codes == encode(p).codes
        assert steps_are_an_order(enc, enc.needs(False)) == steps_are_an_order(encode(p), encode(p).needs(False))
        for model in MODELS:
            assert completes(q, model) == execute(p, model).completed


@pytest.mark.parametrize("call", CALLS)
def test_completes_is_the_verdict_of_the_one_kept_run(call: str) -> None:
    stuck = 0
    for p in programs(call):
        for model in MODELS:
            finished = completes(p, model)
            run = execute(p, model)
            assert execute(p, model) is run, "the unit-time run is made once per program and model"
            assert finished == run.completed
            stuck += not finished
    assert stuck, "the breakages should leave some programs stuck"


BATCH_FIRST_RECEIVES = """pipeline ranks=2 microbatches=1
rank 0: 0F0 <0RECV_B0 0SEND_F0> 0B0
rank 1: 1RECV_F0 1F0 1B0 1SEND_B0
"""


def test_a_grouped_batch_posts_its_members_together() -> None:
    p = parse(BATCH_FIRST_RECEIVES)
    grouped = execute(p, "grouped")
    # The batch is posted at 1; its send meets 1RECV_F0 at once, its receive meets 1SEND_B0
    # at 3, so the batch ends at 3 and 0B0 runs from 3 to 4.
    assert grouped.completed and grouped.makespan == 4.0
    assert grouped.starts == ((0.0, 1.0, 3.0), (0.0, 1.0, 2.0, 3.0))
    assert grouped.ends == ((1.0, 3.0, 4.0), (1.0, 2.0, 3.0, 3.0))
    # Run one after another, the receive blocks first and the send never goes out.
    stopped = execute(p, "rendezvous")
    assert not stopped.completed
    assert sorted((w.rank, w.step, w.needs) for w in stopped.waits) == [(0, 1, "1SEND_B0"), (1, 0, "0SEND_F0")]


@pytest.mark.parametrize("call", CALLS)
def test_table_timing_equals_callback_timing(call: str) -> None:
    for p in programs(call)[:9]:
        table = [[1.0 + 0.25 * s, 1.5, 1.25, 2.75] + [0.0] * 7 for s in range(p.stages)]

        def compute(a: Action) -> float:
            return table[a.stage][a.kind]

        def message(a: Action) -> float:
            return 0.3

        for model in MODELS:
            by_table = execute(p, model, Timing.from_table(table, 0.3))
            by_calls = execute(p, model, Timing(compute=compute, message=message))
            assert (by_table.starts, by_table.ends, by_table.makespan) == (by_calls.starts, by_calls.ends, by_calls.makespan)
            assert by_table.completed == by_calls.completed


def test_uniform_table_uses_the_same_times_as_per_stage_table() -> None:
    p = lower(parse("pipeline ranks=2 microbatches=3\nuse 1f1b()\n"))
    same = [[1.0, 1.0, 1.0, 2.0] + [0.0] * 7] * p.stages
    uneven = [list(row) for row in same]
    uneven[0][Kind.F] = 3.0
    a = execute(p, "rendezvous", Timing.from_table(same, 0.5))
    b = execute(p, "rendezvous", Timing.from_table(uneven, 0.5))
    assert a.makespan < b.makespan
    assert a.ends[0][0] == 1.0 and b.ends[0][0] == 3.0


@pytest.mark.parametrize("call", CALLS)
def test_lowering_keeps_its_rows_as_integers_and_says_its_links_are_in_label_order(
        call: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from ppdsl import links
    from ppdsl.encoding import Encoded, encode
    from ppdsl.ir import LazyRows

    base = programs(call)[0]
    lowered = lower(base)
    plain = all(type(st) is Action for row in base.rows for st in row)
    # Kept as a reader keeps a file's rows when every step is one action; the encoding is
    # made only when asked for, and kept on the program (not in a cache keyed by id()).
    assert isinstance(lowered.rows, LazyRows) == plain
    assert "encoding" not in lowered.derived
    with monkeypatch.context() as patched:  # the links are taken as lowering built them: not worked out
        patched.setattr(links.Links, "__init__", lambda *_: pytest.fail("the links were worked out again"))
        kept = encode(lowered)
        assert encode(lowered) is kept and kept.links.meets is None
    fresh = Encoded(lowered.evolve(rows=tuple(lowered.rows)))  # from the Action objects, links worked out
    assert (kept.codes, kept.steps, kept.groups, kept.kinds) == (fresh.codes, fresh.steps, fresh.groups, fresh.kinds)
    assert fresh.links.meets is None


@pytest.mark.parametrize("call", CALLS)
def test_per_step_times_are_those_of_each_step_s_actions(call: str) -> None:
    """An Execution keeps its times per action; its per-step `starts` and `ends` are made from
    them: a step starts with its first action and ends with its last, idle steps have neither,
    and the makespan is the latest end. Checked on whole, lowered and broken programs (some
    runs stop), and on their timelines (idle steps between the actions)."""
    checked = 0
    for p in programs(call):
        for q in (p, timeline(p)) if not encode(p).invalid and execute(p).completed and not encode(p).has_comms else (p,):
            enc = encode(q)
            if enc.invalid:
                continue
            for model in MODELS:
                run = execute(q, model)
                for r, codes in enumerate(enc.codes):
                    firsts: dict[int, float | None] = {}
                    lasts: dict[int, float | None] = {}
                    for i in range(len(codes)):
                        step = enc.step_of(r, i)
                        firsts.setdefault(step, run.action_starts[r][i])
                        lasts[step] = run.action_ends[r][i]
                    assert len(run.starts[r]) == len(run.ends[r]) == len(q.rows[r])
                    for step in range(len(q.rows[r])):
                        assert run.starts[r][step] == firsts.get(step)
                        assert run.ends[r][step] == lasts.get(step)
                ends = [e for row in run.ends for e in row if e is not None]
                assert run.makespan == max(ends, default=0.0)
                checked += 1
    assert checked > 30


@pytest.mark.parametrize("call", [c for c in CALLS if c != "dualpipev()"])
def test_a_kind_s_steps_are_those_of_each_action_s_first_place(call: str) -> None:
    # `Encoded.step_column` reads each stage's slice of the places; checked against the rows
    # themselves, with actions missing, repeated, and moved onto another rank's row.
    from ppdsl.encoding import COMPUTE_KINDS

    programs = timelines(call)
    rng = random.Random("elsewhere " + call)
    for p in list(programs[:8]):
        rows: list[list[Step]] = [list(row) for row in p.rows]
        r = rng.randrange(len(rows))
        j = rng.choice([j for j, st in enumerate(rows[r]) if st is not IDLE])
        rows[(r + 1) % len(rows)].append(rows[r][j])  # a stage's action on the wrong rank
        rows[r][j] = IDLE
        programs.append(p.evolve(rows=tuple(map(tuple, rows)), source=None))
    moved = 0
    for p in programs:
        enc = encode(p)
        first: dict[tuple[int, Kind, int], int] = {}
        for rank, row in enumerate(p.rows):
            for step, st in enumerate(row):
                if isinstance(st, Action):
                    first.setdefault((st.stage, st.kind, st.microbatch), step)
                    moved += p.placement[st.stage] != rank
        for k in COMPUTE_KINDS:
            if k not in enc.kinds:
                continue
            want = [first.get((s, Kind(k), m), -1) for s in range(p.stages) for m in range(p.microbatches)]
            assert enc.step_column(k) == want, (call, Kind(k))
    assert moved, "some program has an action on another rank's row"
