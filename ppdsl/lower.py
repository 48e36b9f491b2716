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

from itertools import compress, repeat
from operator import add, and_, eq, floordiv, mod, mul, rshift

from .diagnostics import Diagnostic, PpsError
from .ir import Action, Batch, Idle, Program, Step, make_action
from .semantics import B, F, I, KIND_OF, SEND_B, SEND_F, CommModel, Encoded, execute, remember


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
    """The lowered rows and, when every input row is plain actions, their integer codes.

    Works on whole lists at a time (C-level map/compress/sort) rather than action by action:
    this is what keeps lowering 260k actions well under a second."""
    S, M = program.stages, program.microbatches
    placement = program.placement
    R = len(program.rows)
    plain = all(st is None for st in enc.steps)
    SM16 = S * M * 16
    # code -> 1 when that compute's output crosses to another rank, and that rank.
    crosses = bytearray(SM16)
    dest: list[int] = [0] * SM16
    f_cross = bytes(s < S - 1 and placement[s + 1] != placement[s] for s in range(S) for _ in range(M))
    b_cross = bytes(s > 0 and placement[s - 1] != placement[s] for s in range(S) for _ in range(M))
    crosses[F::16], crosses[I::16], crosses[B::16] = f_cross, b_cross, b_cross
    next_rank = [placement[min(s + 1, S - 1)] for s in range(S) for _ in range(M)]
    prev_rank = [placement[max(s - 1, 0)] for s in range(S) for _ in range(M)]
    dest[F::16], dest[I::16], dest[B::16] = next_rank, prev_rank, prev_rank
    send_delta = [0] * 16
    send_delta[F], send_delta[I], send_delta[B] = SEND_F - F, SEND_B - I, SEND_B - B
    to_recv = (M << 4) + 1  # SEND_F(s,m) + to_recv = RECV_F(s+1,m); SEND_B(s,m) - from_recv = RECV_B(s-1,m)
    from_recv = (M << 4) - 1

    # Every exchange a rank takes part in, keyed by G order: time * R + producer rank (ties
    # keep the producer's step order: a stable sort over streams appended in that order).
    ex_keys: list[list[int]] = [[] for _ in range(R)]
    ex_codes: list[list[int]] = [[] for _ in range(R)]
    kept: list[list[Step]] = []
    kept_starts: list[list[float]] = []
    for p, row in enumerate(program.rows):
        row_starts, row_ends = starts[p], ends[p]
        if Idle in set(map(type, row)):
            keep = [j for j, st in enumerate(row) if type(st) is not Idle]
            kept.append([row[j] for j in keep])
            kept_starts.append([row_starts[j] for j in keep])  # type: ignore[misc]
        else:
            kept.append(list(row))
            kept_starts.append(list(row_starts))  # type: ignore[arg-type]
        codes, steps = enc.codes[p], enc.steps[p]
        idx = list(compress(range(len(codes)), map(crosses.__getitem__, codes)))
        if not idx:
            continue
        made = list(map(codes.__getitem__, idx))
        step_idx = idx if steps is None else list(map(steps.__getitem__, idx))
        keys = [int(t) * R + p for t in map(row_ends.__getitem__, step_idx)]  # type: ignore[arg-type]
        sends = [c + send_delta[c & 15] for c in made]
        ex_keys[p] += keys
        ex_codes[p] += sends
        targets = list(map(dest.__getitem__, made))
        recvs = [c + to_recv if c & 15 == SEND_F else c - from_recv for c in sends]
        for q in sorted(set(targets)):
            mine = list(map(eq, targets, repeat(q)))
            ex_keys[q] += compress(keys, mine)
            ex_codes[q] += compress(recvs, mine)

    out: list[tuple[Step, ...]] = []
    out_codes: list[list[int]] = []
    for r in range(R):
        keys, codes_r = ex_keys[r], ex_codes[r]
        n = len(keys) or 1
        # Sorting plain ints `key * n + index` (no key function; timsort merges the
        # presorted streams in C) gives the stable order and the permutation at once.
        ranked = sorted(map(add, map(mul, keys, repeat(n)), range(len(keys))))
        order = list(map(mod, ranked, repeat(n)))
        x_codes = list(map(codes_r.__getitem__, order))
        x_times = list(map(floordiv, map(floordiv, ranked, repeat(n)), repeat(R)))
        sms = list(map(rshift, x_codes, repeat(4)))
        x_items = list(map(make_action, map(floordiv, sms, repeat(M)), map(KIND_OF.__getitem__, map(and_, x_codes, repeat(15))),
                           map(mod, sms, repeat(M))))
        # Merge with the computes: compute j sorts at 2*start+1, an exchange at 2*time, so an
        # exchange goes before every compute starting at or after its time; the same trick
        # with the item index as the low digits.
        computes = kept[r]
        nc = len(computes)
        total = nc + len(x_items)
        merged = sorted([*map(add, map(mul, map(add, map(mul, map(int, kept_starts[r]), repeat(2)), repeat(1)), repeat(total)),
                              range(nc)),
                         *map(add, map(mul, map(mul, x_times, repeat(2)), repeat(total)), range(nc, total))])
        perm = list(map(mod, merged, repeat(total)))
        items = computes + x_items
        out.append(tuple(map(items.__getitem__, perm)))
        if plain:
            all_codes = enc.codes[r] + x_codes
            out_codes.append(list(map(all_codes.__getitem__, perm)))
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
