"""Valid programs pass; every mutation that breaks one is caught.

Valid programs come from the generators (and their lowered forms, under every model).
Mutations: break a dependency (move an action before something its input waits for), drop
an action, duplicate one, move a receive after its consumer, and reorder an exchange so both
sides send first (a rendezvous deadlock).
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Iterator

import pytest

from ppdsl.check import check
from ppdsl.ir import Action, Kind, Program, Step, actions_of
from ppdsl.lower import lower
from ppdsl.expansion import parse

GENERATORS = [
    "1f1b()", "gpipe()", "interleaved_1f1b(virtual=2)", "looped_bfs(virtual=2)", "zb1p()", "zbv()", "dualpipev()",
    "v_half()",
]


def generated(call: str, ranks: int = 4, microbatches: int = 8) -> Program:
    return parse(f"pipeline ranks={ranks} microbatches={microbatches}\nuse {call}\n")


def errors(program: Program, model: str = "rendezvous") -> list[str]:
    return [d.code for d in check(program, model) if d.is_error]


@pytest.mark.parametrize("call", GENERATORS)
def test_valid_programs_are_clean(call: str) -> None:
    program = generated(call)
    assert check(program) == []
    lowered = lower(program)
    for model in ("rendezvous", "grouped", "buffered"):
        assert check(lowered, model) == [], model
    fused = lower(program, fuse=True, comm_model="grouped")
    assert check(fused, "grouped") == []


def with_rows(program: Program, rows: list[list[Step]]) -> Program:
    return program.evolve(rows=tuple(map(tuple, rows)), source=None)


def waits_for(program: Program) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """(rank, step) -> the (rank, step)s it waits for: the previous step, and its inputs."""
    where: dict[tuple[int, Kind, int | None], tuple[int, int]] = {}
    for r, row in enumerate(program.rows):
        for j, st in enumerate(row):
            for a in actions_of(st):
                where[(a.stage, a.kind, a.microbatch)] = (r, j)
    S = program.stages
    out: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for r, row in enumerate(program.rows):
        for j, st in enumerate(row):
            deps = [(r, j - 1)] if j else []
            for a in actions_of(st):
                s, k, m = a.stage, a.kind, a.microbatch
                inputs = []
                if k is Kind.F and s > 0:
                    inputs.append((s - 1, Kind.F, m))
                if k in (Kind.B, Kind.I):
                    inputs.append((s, Kind.F, m))
                    if s < S - 1:
                        inputs += [(s + 1, Kind.B, m), (s + 1, Kind.I, m)]
                if k is Kind.W:
                    inputs.append((s, Kind.I, m))
                deps += [where[x] for x in inputs if x in where]
            out[(r, j)] = deps
    return out


def ancestors(graph: dict[tuple[int, int], list[tuple[int, int]]], node: tuple[int, int]) -> set[tuple[int, int]]:
    seen: set[tuple[int, int]] = set()
    todo = [node]
    while todo:
        for d in graph[todo.pop()]:
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


def break_dependency(program: Program, rng: random.Random) -> Iterator[Program]:
    """Move an action y before an action w of its own row that y's input depends on: now y
    waits for something that waits for y."""
    graph = waits_for(program)
    nodes = list(graph)
    rng.shuffle(nodes)
    for r, j in nodes:
        inputs = [d for d in graph[(r, j)] if d != (r, j - 1)]
        if not inputs:
            continue
        before = ancestors(graph, inputs[0]) | {inputs[0]}
        targets = [w for (rr, w) in before if rr == r and w < j]
        if not targets:
            continue
        w = rng.choice(targets)
        rows = [list(row) for row in program.rows]
        step = rows[r].pop(j)
        rows[r].insert(w, step)
        yield with_rows(program, rows)


def drop_action(program: Program, rng: random.Random) -> Iterator[Program]:
    for _ in range(5):
        rows = [list(row) for row in program.rows]
        r = rng.choice([r for r, row in enumerate(rows) if row])
        rows[r].pop(rng.randrange(len(rows[r])))
        yield with_rows(program, rows)


def duplicate_action(program: Program, rng: random.Random) -> Iterator[Program]:
    for _ in range(5):
        rows = [list(row) for row in program.rows]
        r = rng.choice([r for r, row in enumerate(rows) if row])
        st = rows[r][rng.randrange(len(rows[r]))]
        rows[r].insert(rng.randrange(len(rows[r]) + 1), st)
        yield with_rows(program, rows)


def receive_after_consumer(program: Program, rng: random.Random) -> Iterator[Program]:
    lowered = lower(program)
    recvs = [(r, j) for r, row in enumerate(lowered.rows) for j, st in enumerate(row)
             if isinstance(st, Action) and st.kind.is_recv]
    for r, j in rng.sample(recvs, min(5, len(recvs))):
        recv = lowered.rows[r][j]
        assert isinstance(recv, Action)
        consumer = Kind.F if recv.kind is Kind.RECV_F else None
        row = list(lowered.rows[r])
        k = next(k for k in range(j + 1, len(row)) for a in actions_of(row[k])
                 if a.stage == recv.stage and a.microbatch == recv.microbatch
                 and (a.kind is consumer if consumer else a.kind in (Kind.B, Kind.I)))
        row.insert(k, row.pop(j))  # now right after its consumer
        rows = [list(x) for x in lowered.rows]
        rows[r] = row
        yield with_rows(lowered, rows)


def both_send_first(program: Program, rng: random.Random) -> Iterator[Program]:
    """Exchanges e1 (p -> q) and e2 (q -> p) with SEND(e1) before RECV(e2) on p: move
    RECV(e1) on q after SEND(e2). Both ranks now send first: stuck under rendezvous."""
    lowered = lower(program)
    at: dict[Action, tuple[int, int]] = {}
    for r, row in enumerate(lowered.rows):
        for j, st in enumerate(row):
            if isinstance(st, Action):
                at[st] = (r, j)
    peer = {Kind.SEND_F: (Kind.RECV_F, 1), Kind.SEND_B: (Kind.RECV_B, -1)}
    pairs = []
    for send, (p, i) in at.items():
        if send.kind in peer:
            kind, d = peer[send.kind]
            recv = Action(send.stage + d, kind, send.microbatch)
            pairs.append((send, recv, p, i, at[recv][0], at[recv][1]))
    found = 0
    rng.shuffle(pairs)
    for s1, r1, p, i1, q, j1 in pairs:
        for s2, r2, q2, i2, p2, j2 in pairs:
            if q2 == q and p2 == p and i1 < j2 and j1 < i2:
                rows = [list(x) for x in lowered.rows]
                row = rows[q]
                row.insert(i2, row.pop(j1))  # RECV(e1) now right after SEND(e2)
                yield with_rows(lowered, rows)
                found += 1
                break
        if found >= 3:
            return


MUTATIONS = [break_dependency, drop_action, duplicate_action, receive_after_consumer, both_send_first]


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.__name__)
@pytest.mark.parametrize("call", ["1f1b()", "gpipe()", "interleaved_1f1b(virtual=2)", "zb1p()", "dualpipev()"])
def test_every_mutation_is_caught(call: str, mutation: object) -> None:
    program = generated(call, 4, 8)
    rng = random.Random(zlib.crc32(f"{call}{mutation.__name__}".encode()))  # type: ignore[attr-defined]
    made = 0
    for mutant in mutation(program, rng):  # type: ignore[operator]
        made += 1
        assert errors(mutant), f"{mutation.__name__} not caught"  # type: ignore[attr-defined]
        if made >= 8:
            break
    assert made, "the mutation found nothing to change"


def test_rendezvous_deadlock_is_not_one_under_buffered() -> None:
    """The both-send-first mutant is a rendezvous problem only (unless it also broke order)."""
    program = generated("1f1b()", 2, 4)
    mutant = next(both_send_first(program, random.Random(1)))
    assert "PPS210" in errors(mutant, "rendezvous")
    assert "PPS210" not in errors(mutant, "buffered")
