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
from .ir import Action, Batch, Idle, Kind, Program, Step, ir_setters
from .semantics import RECV_B, RECV_F, SEND_B, SEND_F, CommModel, Encoded, execute, remember


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
    rows, codes = _lowered_rows(program, ctx.enc, ex.starts, ex.ends)
    if fuse:
        rows = _fuse(program, rows, model)
        codes = None
    result = program.evolve(rows=rows, source=None, generated=None)
    if codes is not None:
        remember(result, Encoded(result, codes))
    return result


def _lowered_rows(program: Program, enc: Encoded, starts: tuple[tuple[float | None, ...], ...],
                  ends: tuple[tuple[float | None, ...], ...]
                  ) -> tuple[tuple[tuple[Step, ...], ...], list[list[int]] | None]:
    """The lowered rows and, when every input row is plain actions, their integer codes."""
    S, M = program.stages, program.microbatches
    placement = program.placement
    R = len(program.rows)
    new, set_stage, set_kind, set_mb = object.__new__, *ir_setters()
    K_SEND_F, K_RECV_F, K_SEND_B, K_RECV_B = Kind.SEND_F, Kind.RECV_F, Kind.SEND_B, Kind.RECV_B
    plain = all(st is None for st in enc.steps)
    # Per (stage * M + mb): does its forward (backward) output cross to another rank?
    f_cross: list[bool] = []
    b_cross: list[bool] = []
    for s in range(S):
        f_cross += [s < S - 1 and placement[s + 1] != placement[s]] * M
        b_cross += [s > 0 and placement[s - 1] != placement[s]] * M
    # Exchanges by the (integer, under unit time) time their producer ends, in producer
    # (rank, step, part) order within one time: (send, its rank, receive, its rank).
    buckets: dict[int, list[tuple[Action, int, Action, int, int]]] = {}
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
        codes, steps = enc.codes[r], enc.steps[r]
        producing = [i for i, c in enumerate(codes)
                     if ((c & 15) == 0 and f_cross[c >> 4]) or ((c & 15) in (1, 3) and b_cross[c >> 4])]
        for i in producing:
            c = codes[i]
            stage, m = divmod(c >> 4, M)
            send = new(Action)
            recv = new(Action)
            set_mb(send, m)
            set_mb(recv, m)
            set_stage(send, stage)
            sm = c >> 4
            if c & 15 == 0:  # F: forward output to the next stage
                set_kind(send, K_SEND_F)
                set_stage(recv, stage + 1)
                set_kind(recv, K_RECV_F)
                q = placement[stage + 1]
                send_code = sm << 4 | SEND_F
            else:  # B or I: input gradient to the previous stage
                set_kind(send, K_SEND_B)
                set_stage(recv, stage - 1)
                set_kind(recv, K_RECV_B)
                q = placement[stage - 1]
                send_code = sm << 4 | SEND_B
            end = row_ends[i if steps is None else steps[i]]
            assert end is not None
            t = int(end)
            bucket = buckets.get(t)
            if bucket is None:
                buckets[t] = [(send, r, recv, q, send_code)]
            else:
                bucket.append((send, r, recv, q, send_code))
    # Each rank's exchanges in G order, then one merge per rank with its computes.
    ex_times: list[list[int]] = [[] for _ in range(R)]
    ex_items: list[list[Step]] = [[] for _ in range(R)]
    ex_codes: list[list[int]] = [[] for _ in range(R)]
    peer = (M << 4) + 1  # SEND_F(s,m) -> RECV_F(s+1,m); SEND_B(s,m) -> RECV_B(s-1,m) is -(M << 4) + 1
    for t in sorted(buckets):
        for send, p, recv, q, code in buckets[t]:
            ex_times[p].append(t)
            ex_items[p].append(send)
            ex_codes[p].append(code)
            ex_times[q].append(t)
            ex_items[q].append(recv)
            ex_codes[q].append(code + peer if code & 15 == SEND_F else code - (M << 4) + 1)
    out: list[tuple[Step, ...]] = []
    out_codes: list[list[int]] = []
    for r in range(R):
        computes, starts_r, codes = kept[r], kept_starts[r], enc.codes[r]
        n = len(computes)
        merged: list[Step] = []
        merged_codes: list[int] = []
        add, add_code = merged.append, merged_codes.append
        j = 0
        for t, item, code in zip(ex_times[r], ex_items[r], ex_codes[r]):
            if j < n and starts_r[j] < t:
                # Computes that start before this exchange (a run, found by bisection).
                stop = bisect_left(starts_r, t, j)
                merged.extend(computes[j:stop])
                if plain:
                    merged_codes.extend(codes[j:stop])
                j = stop
            add(item)
            add_code(code)
        merged.extend(computes[j:])
        merged_codes.extend(codes[j:])
        out.append(tuple(merged))
        out_codes.append(merged_codes)
    return tuple(out), (out_codes if plain else None)


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
