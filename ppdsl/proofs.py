"""Proofs that a program runs to the end, read from its encoding without the engine's loop.

The engine (`semantics._Engine._loop`) blocks and wakes a rank once per thing it waits for:
once per microbatch in a compute-only interleaved 1F1B, once per message pair in its lowered
form. Two common shapes of program can be shown to run to the end with whole-column
comparisons instead, each reading the rule from the same `encoding.Needs` tables the loop
reads (so it states no rule of its own):

- `steps_are_an_order`: a compute-only timeline (PyTorch's CSV, one cell per time step) whose
  step indices order every dependency;
- `rows_carry_their_inputs`: a program with sends and receives (a lowered one) where every
  action's inputs are completed earlier in its own row, so that a rank only ever waits for a
  peer; whether every peer is met is then one walk over the sends and receives alone, one step
  per pair (`pairs_meet`).

Each proof answers True only for a program the loop would run to the end; False answers
nothing (the loop decides, and explains a stop). `semantics.completes` asks them first.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from itertools import compress, repeat
from operator import and_, ge, lt

from .layout import COMM_MAX, COMPUTE_MAX, EXCHANGE_BIT, KIND_MASK, KIND_SPACE
from .links import named_deltas
from .encoding import (COMM_KINDS, COMPUTE_KINDS, NOTHING, PEER_OF_KIND, PRODUCERS, SLOT_BITS,
                       SLOT_MASK, Encoded, Needs, code_space, kind_slice)


def _producers_beside_consumers(needs: Needs, S: int, M: int, columns: dict[int, list[int]]
                                ) -> Iterator[tuple[list[int], list[int]] | None]:
    """Per need in the `Needs` tables of each kind in `columns` (a kind -> a value per
    (stage, microbatch), such as a step or a place), the producers' values beside the
    consumers': two aligned lists, the i-th producer's value beside the value of the i-th
    action that waits for it. None where no kind of `columns`, or more than one, completes
    what is needed, or where a send or receive waits for another (stage, microbatch) (a
    buffered receive): the proofs then answer nothing.

    A need whose offset is one per stage is read a run of stages at a time: one slice each."""
    def made_by(slot: int) -> list[int] | None:
        found = [columns[k] for k in PRODUCERS[slot] if k in columns]
        return found[0] if len(found) == 1 else None

    for k, mine in columns.items():
        if k > COMPUTE_MAX:  # a send or receive: what it sends, of its own (stage, microbatch)
            off = needs.need_off[k]
            if off is not None:
                yield None if off >> SLOT_BITS else _aligned(made_by(off & SLOT_MASK), mine)
            continue
        slot = needs.local_slot[k]
        if slot != NOTHING:
            yield _aligned(made_by(slot), mine)
        offsets = needs.input_off[k]
        s = 0
        while s < S:
            off = offsets[s * M]
            end = s + 1
            while end < S and offsets[end * M] == off:
                end += 1
            if off != NOTHING:
                theirs = made_by(off & SLOT_MASK)
                shift = off >> SLOT_BITS  # the producer's (stage, microbatch) is this far away
                a, b = s * M, end * M
                yield None if theirs is None else (theirs[a + shift:b + shift], mine[a:b])
            s = end


def _aligned(theirs: list[int] | None, mine: list[int]) -> tuple[list[int], list[int]] | None:
    return None if theirs is None else (theirs, mine)


def steps_are_an_order(enc: Encoded, needs: Needs) -> bool:
    """Whether a compute-only program's step indices order its dependencies: every input of
    every action done at an earlier step than the action's own, as in a timeline written one
    cell per time step (PyTorch's CSV, whose empty cells are the bubbles). Then running the
    actions step by step across ranks respects program order (steps increase along a row) and
    every dependency, so the program runs to the end under any model: the loop's verdict,
    without its blocks and wakes. False answers nothing (the loop decides): also when an
    action is repeated or a kind is missing for some stage and microbatch, when the proof
    would need more care than this one takes.

    The test is a few C-level passes over columns: per compute kind, the step of every
    (stage, microbatch), `Encoded.step_column`; per need in the `Needs` tables (`local_slot`,
    `input_off`, whose offset is one per stage), one comparison of two slices."""
    if not enc.unrepeated:
        return False  # a repeated action: its second place would go unchecked
    at: dict[int, list[int]] = {}  # kind -> the step of every (stage, microbatch) of that kind
    for k in COMPUTE_KINDS:
        if k in enc.kinds:
            at[k] = enc.step_column(k)
            if -1 in at[k]:
                return False
    for pair in _producers_beside_consumers(needs, enc.stages, enc.microbatches, at):
        if pair is None or not all(map(lt, *pair)):
            return False
    return True


def rows_carry_their_inputs(enc: Encoded, needs: Needs) -> bool:
    """Whether a program with sends and receives runs to the end under `rendezvous` (and so
    under `grouped` when it has no batch), shown in two parts:

    1. every action's inputs are completed by an action earlier in its own row, read from the
       `Needs` tables one column of `Encoded.pos` per need (places `rank << SHIFT | i`: on one
       rank, an earlier action has a smaller place). Each stage's actions must be on the rank
       its placement names, and then every need is of the same rank: of its own stage (its F
       or I, its receive, the compute a send sends) or of a neighbouring stage on the same
       rank (`encoding.input_tables` points anything else at the receive). So a rank never
       waits for data: what it needs is done by the time it gets there, since a rank
       completes its actions in order;
    2. so a rank only ever waits at a send or receive for its peer, and whether each one is
       met is a walk over the sends and receives alone (`pairs_meet`).

    It takes what makes a place table whole: every action once, and on every link the k-th
    send is the one the k-th receive names (`Needs.meets` is None); else it answers nothing."""
    if needs.buffered or needs.meets is not None or not enc.unrepeated or any(enc.groups):
        return False
    placed: list[set[int]] = [set() for _ in enc.codes]
    for s, r in enumerate(enc.placement):
        placed[r].add(s)
    if not all(enc.stages_of(r) <= placed[r] for r in range(len(enc.codes))):
        return False  # a stage off its rank (PPS101): the places below would not compare
    M = enc.microbatches
    columns = {k: enc.column(k) for k in (*COMPUTE_KINDS, *COMM_KINDS) if k in enc.kinds}
    for pair in _producers_beside_consumers(needs, enc.stages, M, columns):
        if pair is None or not _made_earlier(*pair, M):
            return False
    return pairs_meet(enc)


def _made_earlier(theirs: list[int], mine: list[int], M: int) -> bool:
    """Whether every action in `mine` (places, -1: absent) has its producer in `theirs` there
    and earlier. Where some (stage, microbatch) lacks the action, stage by stage: a stage
    without it (often a whole one, as the last stage's sends) is skipped, not masked."""
    if -1 not in mine:
        return -1 not in theirs and all(map(lt, theirs, mine))
    for lo in range(0, len(mine), M):
        mine_here, theirs_here = mine[lo:lo + M], theirs[lo:lo + M]
        if -1 in mine_here:
            if mine_here.count(-1) == M:
                continue  # nothing of this stage waits
            present = list(map(ge, mine_here, repeat(0)))
            theirs_here, mine_here = list(compress(theirs_here, present)), list(compress(mine_here, present))
        if -1 in theirs_here or not all(map(lt, theirs_here, mine_here)):
            return False  # not made, or made later in the row
    return True


def pairs_meet(enc: Encoded) -> bool:
    """Whether every send and receive meets its peer when each rank waits only at them and
    every stage is on the rank its placement names: part 2 of `rows_carry_their_inputs`,
    whose part 1 it takes as given. A rank stands, posted, at its first send or receive not
    yet met; a rank that comes to the peer of a posted one meets it, and both go on. Every
    rank reaching its end is the loop's verdict: the loop's ranks stop at the same operations.

    The peers are those the labels name (`PEER_OF_KIND`, as `links.named_deltas`: the caller
    has checked that the links agree), worked out at each step from a table of deltas per kind value: a
    table of every code's peer, or lists of peers beside the rows, cost more to make than the
    walk spends on the arithmetic, and the big table's lookups miss the cache. A send or
    receive that names a stage outside the pipeline never meets anything: then the answer is
    no at once."""
    S, M = enc.stages, enc.microbatches
    pos = enc.pos
    for k in COMM_KINDS:
        if k in enc.kinds and pos[kind_slice(S - 1 if PEER_OF_KIND[k][0] > 0 else 0, k, M)].count(-1) != M:
            return False  # it names a stage past the last or before the first: it waits for good
    space = code_space(S, M)
    # Two codes past every real one: what ends each row (kind bits KIND_MASK, which no action
    # has) and its peer, `never`, which nothing posts: a rank at its end waits for good.
    end_of_row, never = space + KIND_MASK, space + KIND_SPACE
    delta = named_deltas(M)  # code + delta[kind]: the peer its label names
    delta[KIND_MASK] = never - end_of_row
    # Per rank, its sends and receives in row order, then the end; a rank is named by its
    # number plus one, so that 0 in `posted` says no one waits there.
    rows: list[list[int]] = [[end_of_row]]
    by_bit = EXCHANGE_BIT and max(enc.kinds, default=0) <= COMM_MAX  # no stage-only action: one `&` a code tells
    exchanged = None if by_bit else bytearray(k in COMM_KINDS for k in range(KIND_SPACE))  # 1 at a send's or receive's kind
    for codes in enc.codes:
        kinds = map(and_, codes, repeat(EXCHANGE_BIT if by_bit else KIND_MASK))
        row = list(compress(codes, kinds if exchanged is None else map(exchanged.__getitem__, kinds)))
        row.append(end_of_row)
        rows.append(row)
    # At the code of an operation a rank waits at, that rank: the one a peer that comes moves on.
    posted = bytearray(never + 1) if len(rows) <= 256 else array("l", [0]) * (never + 1)
    head = [0] * len(rows)  # per rank, the index in its row of where it stands
    work = list(range(1, len(rows)))
    pop, push = work.pop, work.append
    km = KIND_MASK  # a local: a global costs a lookup per operation
    while work:
        r = pop()
        j = head[r]
        row = rows[r]
        while True:
            c = row[j]
            q = posted[c + delta[c & km]]  # who waits at the peer
            if not q:
                posted[c] = r  # waits there until the peer comes (at the end: for good)
                break
            j += 1  # the pair meets: both ranks go on
            h = head[q] + 1
            head[q] = h
            d = rows[q][h]
            if posted[d + delta[d & km]]:
                push(q)  # its next one meets too: it goes on from the work list
            else:
                posted[d] = q  # it waits there, with no trip through the work list
        head[r] = j
    return all(h == len(row) - 1 for h, row in zip(head, rows))
