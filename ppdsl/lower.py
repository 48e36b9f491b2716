"""Lowering: a compute-only program -> the same program with every send and receive written out.

Why the result cannot deadlock under `rendezvous` (and so under `grouped` and `buffered`,
which only ever let more operations complete):

1. The compute-only program is sound (the checker passes it); it runs to the end, so its unit-time execution
   (`semantics.execute`, unit compute, free messages) gives every step a start and an end,
   and every data dependency runs from an earlier end to a later-or-equal start.
2. Each dependency between ranks becomes one *exchange* event at the time its consumer
   starts: `SEND` on the producer's rank, `RECV` on the consumer's. Compute events sit at
   their start times. All events are put in one global order G by (time, exchanges before
   computes, then producer rank, step, part): a total order in which every compute comes
   after the exchanges that feed it (made at its start, exchanges first on ties) and every
   exchange after the compute it carries (producer end <= consumer start, and a compute
   ends after it starts). Any time between the producer's end and the consumer's start
   would do for the proof; the latest is chosen because a rendezvous then meets a receiver
   that is about to need the data, while the sender, which is ahead, goes on computing
   first. At the producer's end (the earlier choice) the sender would stop there and, on a
   pipeline like zb1p at 2 ranks, rank 0 could start a forward only after the last stage
   had sent it a gradient: a round trip per microbatch on the slowest rank (what each choice
   costs the generators' schedules: benchmarks/RESULTS.md).
3. Each rank's row is exactly G restricted to that rank: its computes keep their order, and
   an exchange appears on both of its ranks at the same place in G. So on every link the
   sends and the receives come in one order, G's: the k-th receive names the k-th send, as
   the transports match them (`links.Links`), and PPS212 cannot arise.

Run the rows: by induction over G, when every event before e has completed, e is at the
head of the row of each rank it involves (those rows are projections of G), its inputs are
done (they come earlier in G), and for an exchange both the send and the receive are
posted, so under rendezvous the pair completes. Hence every event completes: no deadlock,
whatever the actual durations. A hand-off between two stages on the same rank (the turn of
a V) stays local: no send or receive.

The rows are placed by whole-list passes, and when no input row has an overlapped pair or a
batch they are kept as a reader keeps a file's rows (`ir.LazyRows` of `encoding.row_codes`:
per step its stage-kind and microbatch): printing the lowered program and checking it make
no Action object; they are made only for a pass that asks for a row's steps. Its encoding
is made only if something asks for it (the printer does not), from those integers, with its
links known to be in label order (`encoding.links_in_label_order`).

`fuse=True` puts each run of adjacent sends and receives of one rank into a batch, as the
seed's `_batch_p2p` does. Under `rendezvous` and `buffered` a batch runs its members in the
written order, so nothing changes; under `grouped` the members are posted together, which
only lets more complete, but the result is executed to make sure, and any batch on a wait
cycle is split back (never reached with lowered programs; kept as a guarantee).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain, compress, repeat
from operator import add, and_, ge, mul
from typing import cast

from .diagnostics import Diagnostic, PpsError
from .ir import Action, Batch, Idle, Kind, LazyRows, Program, RowCodes, Rows, Step, make_actions
from .semantics import CommModel, Execution, execute
from .encoding import (COMPLETES, INPUT_FROM_RECEIVE, LOW, PEER_OF_KIND, PRODUCERS, SEND_NEEDS, Encoded,
                       at_places, encode, links_in_label_order, read_rows, row_codes, stage_kind)
from .gather import gather
from .gcpause import no_gc


# The exchanges lowering writes, read from the rule's data in the encoding: a send carries what
# its `SEND_NEEDS` slot's producers complete, to the stage and receive `PEER_OF_KIND` names.
# (producer kind, send kind, receive kind, stage step): F -> SEND_F/RECV_F to s+1, B and I ->
# SEND_B/RECV_B to s-1, in that order (it fixes the order of exchanges made at one time).
_EXCHANGES: tuple[tuple[int, Kind, Kind, int], ...] = tuple(
    (k, Kind(send), Kind(PEER_OF_KIND[send][1]), PEER_OF_KIND[send][0])
    for send, slot in SEND_NEEDS.items() for k in PRODUCERS[slot])


def needs_lowering(program: Program) -> bool:
    """True when stages on different ranks exchange data but the program has no send/recv."""
    if encode(program).has_comms:
        return False
    P = program.placement
    return any(P[s] != P[s + 1] for s in range(program.stages - 1))


def lower(program: Program, fuse: bool = False, comm_model: str | CommModel = "rendezvous") -> Program:
    """Insert sends and receives into a compute-only program the checker passes.

    Lowering needs what its proof above needs, and asks it of the layers below it, not of the
    checker: no communication yet (PPS220), and a unit-time run under `rendezvous` that ends
    (`semantics.execute`, the run the exchanges are placed by). It raises PpsError (PPS220)
    when either fails. Why a program fails is the checker's to say: `ppdsl.check.lower_checked`
    (what `ppdsl expand --comms` runs) checks first and raises the checker's diagnostics."""
    with no_gc():
        return _lower(program, fuse, comm_model)


def refuse_communication(program: Program) -> None:
    """PPS220 when `program` already has sends or receives: there is nothing to lower."""
    if encode(program).has_comms:
        raise PpsError([_refusal(program, "the program already has sends and receives; lowering needs a "
                                 "compute-only program", "lint it with `ppdsl lint` instead")])


def unit_run(program: Program) -> Execution | None:
    """The unit-time `rendezvous` run lowering places exchanges by (kept on the program), or
    None when the program has out-of-range actions and cannot run."""
    return None if encode(program).invalid else execute(program, CommModel.RENDEZVOUS)


def _refusal(program: Program, message: str, help: str) -> Diagnostic:
    path = program.source.path if program.source is not None else "<input>"
    return Diagnostic("PPS220", message, path, help=help)


def _lower(program: Program, fuse: bool, comm_model: str | CommModel) -> Program:
    model = CommModel(comm_model)
    refuse_communication(program)
    enc = encode(program)
    ex = unit_run(program)
    if ex is None or not ex.completed:
        raise PpsError([_refusal(program, "the program does not run to the end under `rendezvous`; lowering "
                                 "needs one that does", "`ppdsl lint` says where and why it stops")])
    rows = _lowered_rows(program, enc, enc.column, ex)
    if fuse:
        return program.evolve(rows=_fuse(program, rows, model), source=None, generated=None)
    result = program.evolve(rows=rows, source=None, generated=None)
    # Every link is in label order by construction (point 3 above; a property test holds it):
    # an encoding of the result, if one is asked for, takes its links as they are, unscanned.
    links_in_label_order(result)
    return result


def _lowered_rows(program: Program, enc: Encoded, column: Callable[[int], list[int]], ex: Execution) -> Rows:
    """The lowered rows; when no input row has an overlapped pair or a batch, kept as a
    reader keeps its rows (`ir.LazyRows` of `ir.RowCodes`), made into Action objects only if
    someone asks for them: the printer and the checker do not, and the encoding, if one is
    asked for, is made from those integers as a file's.

    `column(kind)` gives, per `stage * M + mb`, the global index (`rank << SHIFT | i`) of that
    action, or -1 (the checker's position table). Work goes by whole lists (C-level
    map/compress/sort), one (stage, kind) at a time: the exchanges of `F` of stage s all go
    from one rank to one other rank, with codes and Action fields that are ranges and
    constants, so only their times differ.

    Each rank's events are placed by one stable sort of their positions by a key
    (`sorted(range(W), key=keys.__getitem__)`, W events): an exchange made at time T and a
    compute starting at T both have key T, and the exchanges are laid out before the computes,
    so that they come before every compute starting at or after their time; exchanges of one
    time keep their position order, which is producer rank, then the producer's step order (each
    rank's exchanges are laid out producer by producer). The times of the unit-time run are
    whole numbers kept as the floats the engine gives (exact far beyond any key here, and a list
    of floats sorts as fast as one of ints): once one sort of ints `key * W + position` with
    `int()` of every time and a final `% W`, lowering took 1.5x the CPU time (medians,
    alternating, on the 262,144-action Interleaved1F1B of `bench_cli.py`). Only an overlapped
    pair makes two exchanges of one producer at one time, possibly out of stage order; with
    pairs present, keys also carry the producer and its action index (`T * R * L + p * L + i`)."""
    S, M = program.stages, program.microbatches
    placement = program.placement
    R = len(program.rows)
    as_codes = not any(enc.groups)  # one action or an idle step a step: the rows are made as integers
    wide = any(not is_batch for groups in enc.groups for is_batch, _ in groups.values())
    L = max(max(map(len, program.rows), default=0), max(map(len, enc.codes), default=0)) + 1 if wide else 0
    C = R * L if wide else 1  # one time unit of an exchange key

    # Per rank, per producer rank: its runs of exchanges, each as (keys, then the columns of the
    # rows being made: stage-kinds and microbatches for rows made as integers, or Actions).
    # Each column of a row is made once, by one chain of its runs.
    x_runs: list[dict[int, list[tuple[Sequence[object], ...]]]] = [{} for _ in range(R)]

    def put(rank: int, producer: int, keys: list[float], *columns: Sequence[object]) -> None:
        x_runs[rank].setdefault(producer, []).append((keys, *columns))

    for s in range(S):
        p = placement[s]
        for k, send_kind, recv_kind, step in _EXCHANGES:
            peer = s + step
            if not 0 <= peer < S or placement[peer] == p:
                continue  # the end of the pipeline, or a hand-off on one rank (the turn of a V)
            where = column(k)[s * M:s * M + M]
            mbs: Sequence[int] = range(M)
            if -1 in where:  # this kind is not there for every microbatch (B and I mixed; inference)
                present = list(map(ge, where, repeat(0)))
                where = list(compress(where, present))
                mbs = list(compress(mbs, present))
                if not where:
                    continue
            n = len(where)
            made_at = _exchange_times(enc, ex, p, where, recv_kind, peer, M, mbs)
            keys = list(map(add, map(mul, made_at, repeat(C)), map(add, map(and_, where, repeat(LOW)), repeat(p * L)))) \
                if wide else made_at
            if as_codes:
                put(p, p, keys, [stage_kind(s, send_kind)] * n, mbs)
                put(placement[peer], p, keys, [stage_kind(peer, recv_kind)] * n, mbs)
            else:
                put(p, p, keys, make_actions(n, repeat(s), repeat(send_kind), mbs))
                put(placement[peer], p, keys, make_actions(n, repeat(peer), repeat(recv_kind), mbs))

    read = read_rows(program)
    out: list[tuple[Step, ...]] = []
    out_read: list[RowCodes | None] = []
    # row_codes builds tables of stages x microbatches: once for every row, not once a rank
    # (65,536 ranks x 4 microbatches took minutes).
    made_read: list[RowCodes] | None = None
    for r in range(R):
        # The computes in row order with their starts (idle steps carry no action: dropped).
        steps = enc.steps[r]
        computes: list[Sequence[object]]  # its columns, as the runs' after their keys
        c_starts: Sequence[float | None]
        if as_codes:  # one code a step that is not idle
            c_starts = ex.action_starts[r]
            as_read = read[r] if read is not None else None
            if as_read is None:
                if made_read is None:
                    made_read = row_codes([list(enc.codes[q]) for q in range(R)], S, M)
                as_read = made_read[r]
            elif steps is not None:
                as_read = (gather(as_read[0], steps), gather(as_read[1], steps))
            computes = [as_read[0], as_read[1]]
        else:  # per step: an overlapped pair or a batch is one item
            row = program.rows[r]
            keep = [j for j, st in enumerate(row) if type(st) is not Idle]
            computes = [[row[j] for j in keep]]
            row_starts = ex.starts[r]
            c_starts = [row_starts[j] for j in keep]
        runs = [run for p in sorted(x_runs[r]) for run in x_runs[r][p]]
        columns = [list(chain(*[run[i] for run in runs], mine)) for i, mine in enumerate(computes, 1)]
        # A compute's key (T + 1)C - 1, in units of exchange keys: at or past every exchange
        # key of time T, before those of T + 1. The sort is stable: equal keys keep their
        # position, and the exchanges come first (producer by producer, then the computes in
        # row order), so a compute goes after the exchanges of its time: at one unit (C = 1)
        # its key is its start itself, the engine's float, and no key is made.
        c_keys = c_starts if C == 1 else map(add, map(mul, c_starts, repeat(C)), repeat(C - 1))
        keys = list(chain(*[run[0] for run in runs], c_keys))
        perm = sorted(range(len(keys)), key=keys.__getitem__)
        placed = [gather(col, perm) for col in columns]
        if as_codes:
            out_read.append(cast("RowCodes", (placed[0], placed[1])))
        else:
            out.append(cast("tuple[Step, ...]", tuple(placed[0])))
    return LazyRows([None] * R, out_read) if as_codes else tuple(out)


def _exchange_times(enc: Encoded, ex: Execution, producer_rank: int, produced: list[int],
                    recv_kind: int, stage: int, M: int, mbs: Sequence[int]) -> list[float]:
    """When each exchange is made: when the action of `stage` that uses what the receive
    brings starts (its `INPUT_FROM_RECEIVE` slot: F for RECV_F, B or I for RECV_B), the latest
    time the proof allows (see the module docstring for why). Where no action uses it (a
    program the checker would call incomplete), when its producer (`produced`, places on
    `producer_rank`) ends."""
    slot = COMPLETES[recv_kind]
    lo, rank = stage * M, enc.placement[stage]
    cols = [cast("list[float]", at_places(enc.column(k)[lo:lo + M], rank, ex.action_starts.__getitem__, -1.0))
            for k, s in INPUT_FROM_RECEIVE.items() if s == slot and k in enc.kinds]
    # One action of (stage, mb) makes its backward's gradient, B or I: the other one is -1.
    times = [-1.0] * M if not cols else cols[0] if len(cols) == 1 else list(map(max, *cols))
    if len(mbs) != M:
        times = gather(times, mbs)
    if -1.0 in times:
        ends = ex.action_ends[producer_rank]
        return [t if t >= 0 else cast(float, ends[i & LOW]) for t, i in zip(times, produced)]
    return times


def _fuse(program: Program, rows: Rows, model: CommModel) -> Rows:
    fused_rows: list[tuple[Step, ...]] = []
    for row in rows:
        out: list[Step] = []
        run: list[Action] = []
        for st in row:
            if type(st) is Action and st.kind.is_comm:
                run.append(st)
                continue
            _close(run, out)
            out.append(st)
        _close(run, out)
        fused_rows.append(tuple(out))
    result = tuple(fused_rows)
    if model is CommModel.GROUPED:
        # Only `grouped` changes what a batch means; split any batch a rank gets stuck in.
        for _ in range(len(rows) + 1):
            ex = execute(program.evolve(rows=result, source=None), model)
            if ex.completed:
                break
            stuck = {(w.rank, w.step) for w in ex.waits}
            result = tuple(
                tuple(p for j, st in enumerate(row) for p in ((st.parts if (r, j) in stuck and type(st) is Batch else (st,))))
                for r, row in enumerate(result))
        else:  # pragma: no cover - lowered rows complete under grouped
            return rows
    return result


def _close(run: list[Action], out: list[Step]) -> None:
    if len(run) >= 2:
        out.append(Batch(tuple(run)))
    else:
        out.extend(run)
    run.clear()
