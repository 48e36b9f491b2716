"""Lowering: a compute-only program -> the same program with every send and receive written out.

Why the result cannot deadlock under `rendezvous` (and so under `grouped` and `buffered`,
which only ever let more operations complete):

1. The compute-only program is first checked; it runs to the end, so its unit-time execution
   (`semantics.execute`, unit compute, free messages) gives every step a start and an end,
   and every data dependency runs from an earlier end to a later-or-equal start.
2. Each dependency between ranks becomes one *exchange* event at the time its producer ends:
   `SEND` on the producer's rank, `RECV` on the consumer's. Compute events sit at their
   start times. All events are put in one global order G by (time, exchanges before
   computes, then producer rank, step, part): a total order in which every compute comes
   after the exchanges that feed it (producer end <= consumer start, exchanges first on
   ties) and every exchange after the compute it carries (a compute ends after it starts).
3. Each rank's row is exactly G restricted to that rank: its computes keep their order, and
   an exchange appears on both of its ranks at the same place in G.

Run the rows: by induction over G, when every event before e has completed, e is at the
head of the row of each rank it involves (those rows are projections of G), its inputs are
done (they come earlier in G), and for an exchange both the send and the receive are
posted, so under rendezvous the pair completes. Hence every event completes: no deadlock,
whatever the actual durations. A hand-off between two stages on the same rank (the turn of
a V) stays local: no send or receive.

`fuse=True` puts each run of adjacent sends and receives of one rank into a batch, as the
seed's `_batch_p2p` does. Under `rendezvous` and `buffered` a batch runs its members in the
written order, so nothing changes; under `grouped` the members are posted together, which
only lets more complete, but the result is executed to make sure, and any batch on a wait
cycle is split back (never reached with lowered programs; kept as a guarantee).
"""

from __future__ import annotations

from bisect import bisect_left

from .diagnostics import Diagnostic, PpsError
from .ir import Action, Batch, Idle, Kind, Program, Step, actions_of, make_action
from .semantics import CommModel, execute


def lower(program: Program, fuse: bool = False, comm_model: str | CommModel = "rendezvous") -> Program:
    """Insert sends and receives; raise PpsError when the program is not a sound compute-only one."""
    from .check.context import no_gc

    with no_gc():
        return _lower(program, fuse, comm_model)


def _lower(program: Program, fuse: bool, comm_model: str | CommModel) -> Program:
    from .check import analyse

    model = CommModel(comm_model)
    diagnostics, ctx = analyse(program, CommModel.RENDEZVOUS, families=("structure", "completeness", "order", "deadlock"),
                               stop_if_comms=True)
    if ctx.has_comms:
        raise PpsError([Diagnostic("PPS220", "the program already has sends and receives; lowering needs a "
                                   "compute-only program", ctx.path, help="lint it with `ppdsl lint` instead")])
    errors = [d for d in diagnostics if d.is_error]
    if errors:
        raise PpsError(errors)
    ex = ctx.execution
    assert ex is not None and ex.completed
    rows = _lowered_rows(program, ex.starts, ex.ends)
    if fuse:
        rows = _fuse(program, rows, model)
    return program.evolve(rows=rows, source=None, generated=None)


def _lowered_rows(program: Program, starts: tuple[tuple[float | None, ...], ...],
                  ends: tuple[tuple[float | None, ...], ...]) -> tuple[tuple[Step, ...], ...]:
    S = program.stages
    placement = program.placement
    R = len(program.rows)
    last = S - 1
    F, B, I = Kind.F, Kind.B, Kind.I
    SEND_F, RECV_F, SEND_B, RECV_B = Kind.SEND_F, Kind.RECV_F, Kind.SEND_B, Kind.RECV_B
    # Exchanges by the (integer, under unit time) time their producer ends, in producer
    # (rank, step, part) order within one time.
    buckets: dict[int, list[tuple[Action, int, Action, int]]] = {}
    # Per rank: the steps that are not idle, and their start times (non-decreasing).
    kept: list[list[Step]] = []
    kept_starts: list[list[float]] = []
    for r, row in enumerate(program.rows):
        row_starts, row_ends = starts[r], ends[r]
        if Idle in set(map(type, row)):
            idx = [j for j, st in enumerate(row) if type(st) is not Idle]
            kept.append([row[j] for j in idx])
            kept_starts.append([row_starts[j] for j in idx])  # type: ignore[misc]
        else:
            kept.append(list(row))
            kept_starts.append(list(row_starts))  # type: ignore[arg-type]
        for j, st in enumerate(row):
            parts = (st,) if type(st) is Action else actions_of(st)
            for a in parts:
                k = a.kind
                s = a.stage
                if k is F:
                    if s == last or placement[s + 1] == r:
                        continue
                    m = a.microbatch
                    ex = (make_action(s, SEND_F, m), r, make_action(s + 1, RECV_F, m), placement[s + 1])
                elif k is B or k is I:
                    if s == 0 or placement[s - 1] == r:
                        continue
                    m = a.microbatch
                    ex = (make_action(s, SEND_B, m), r, make_action(s - 1, RECV_B, m), placement[s - 1])
                else:
                    continue
                end = row_ends[j]
                assert end is not None
                t = int(end)
                bucket = buckets.get(t)
                if bucket is None:
                    buckets[t] = [ex]
                else:
                    bucket.append(ex)
    # Each rank's exchanges in G order, then one merge per rank with its computes.
    ex_times: list[list[int]] = [[] for _ in range(R)]
    ex_items: list[list[Step]] = [[] for _ in range(R)]
    for t in sorted(buckets):
        for send, p, recv, q in buckets[t]:
            ex_times[p].append(t)
            ex_items[p].append(send)
            ex_times[q].append(t)
            ex_items[q].append(recv)
    out: list[tuple[Step, ...]] = []
    for r in range(R):
        computes, starts_r = kept[r], kept_starts[r]
        n = len(computes)
        merged: list[Step] = []
        add = merged.append
        j = 0
        for t, item in zip(ex_times[r], ex_items[r]):
            if j < n and starts_r[j] < t:
                # Computes that start before this exchange (a run, found by bisection).
                stop = bisect_left(starts_r, t, j)
                merged.extend(computes[j:stop])
                j = stop
            add(item)
        merged.extend(computes[j:])
        out.append(tuple(merged))
    return tuple(out)


def _fuse(program: Program, rows: tuple[tuple[Step, ...], ...], model: CommModel) -> tuple[tuple[Step, ...], ...]:
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
