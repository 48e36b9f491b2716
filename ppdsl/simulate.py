"""The simulator: a schedule's timeline, step time, bubble and memory under a cost model.

    >>> sim = simulate(load_program("my.pps"), CostModel((("F", 1.0), ("B", 2.0))))
    >>> sim.makespan, sim.bubble_ratio, sim.peak_memory

The timeline is `semantics.execute`'s (one definition of what a schedule means, for the checker,
the simulator and the runtime): a stuck program still yields the part that ran and where each
rank waits (`completed`, `waits`).

Measures: `busy[r]` is the time rank r spends computing (F, B, I, W, overlapped pairs);
`comm[r]` the time it spends inside sends and receives (blocked ones included); the bubble
ratio is the share of all ranks' time not spent computing, `1 - sum(busy) / (ranks * makespan)`.
A compute-only program has no sends or receives: its data crosses ranks in `handoffs`
implicit messages, each a message time in flight (`handoff_time`), which no rank spends.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from itertools import compress, repeat
from operator import and_, sub

from attrs import frozen

from .costs import DEFAULT, CostModel, parse_inline, shares_of
from .diagnostics import Diagnostic
from .wording import plural
from .ir import Action, Batch, Kind, Overlap, Program, require_program
from .kinds import TABLE
from .memory import UNIT, BytesProfile, MemoryProfile, peak_bytes, peaks_from_codes, profile
from .sim.critical import PathStep, critical_path
from .semantics import CommModel, Execution, Wait, execute, wait_cycle
from .encoding import COMM_KINDS, COMPUTE_KINDS, KIND_MASK, KIND_SPACE, code_space, encode, kind_slice

# Per kind value: whether its time is busy (a compute on the compute lane: an offload's or
# reload's is the copy lane's) or a message's (a send or receive).
_IS_COMPUTE = [k in COMPUTE_KINDS and k not in TABLE.copy for k in range(KIND_SPACE)]
_IS_COMM = [k in COMM_KINDS for k in range(KIND_SPACE)]
_IS_COPY = [k in TABLE.copy for k in range(KIND_SPACE)]


@frozen
class ReloadWait:
    """A backward (`action`, step `step` of rank `rank`) that waited `waited` for `reload`."""

    rank: int
    step: int
    action: str
    reload: str
    waited: float


class Simulation:
    """The result of `simulate`. Per-rank values are tuples indexed by rank."""

    def __init__(self, program: Program, costs: CostModel, comm_model: CommModel, execution: Execution,
                 memory_weights: Sequence[float] | None = None):
        self.program = program
        self.costs = costs
        self.comm_model = comm_model
        self.execution = execution
        self.completed: bool = execution.completed
        self.waits: tuple[Wait, ...] = execution.waits
        self.makespan: float = execution.makespan
        self.starts = execution.starts
        self.ends = execution.ends
        self._weights = memory_weights
        # True when `program` is a compute-only file lowered to explicit send/recv first, as the
        # runtime runs it (`cli.simulate_cmd.simulate_file`, for measured message times).
        self.lowered = False
        busy: list[float] = []
        comm: list[float] = []
        enc = encode(program)
        for r, (row, st, en) in enumerate(zip(program.rows, execution.starts, execution.ends)):
            if enc.steps[r] is None and None not in st and None not in en:
                # One action per step, all run: durations and kinds as whole lists, in C.
                durations = list(map(sub, en, st))
                kinds = list(map(and_, enc.codes[r], repeat(KIND_MASK)))
                busy.append(sum(compress(durations, map(_IS_COMPUTE.__getitem__, kinds))))
                comm.append(sum(compress(durations, map(_IS_COMM.__getitem__, kinds))))
                continue
            b = c = 0.0
            for step, s, e in zip(row, st, en):
                if s is None or e is None:
                    continue
                if isinstance(step, Action):
                    k = step.kind
                    if k.is_compute and not k.on_copy_lane:
                        b += e - s
                    elif k.is_comm:
                        c += e - s
                elif type(step) is Overlap:
                    b += e - s
                elif type(step) is Batch:
                    c += e - s
            busy.append(b)
            comm.append(c)
        self.busy: tuple[float, ...] = tuple(busy)
        self.comm: tuple[float, ...] = tuple(comm)
        total = self.makespan * len(busy)
        self.bubble_ratio: float = 1.0 - sum(busy) / total if total > 0 else 0.0

    @property
    def ranks(self) -> int:
        return self.program.ranks

    @functools.cached_property
    def copy(self) -> tuple[float, ...]:
        """Per rank, the time it spends moving activations (OFFLOAD, RELOAD): on its copy lane,
        beside its computes, in none of busy, comm or idle (with `copy_lane=0`, in its own
        time, not idle)."""
        enc = encode(self.program)
        if enc.kinds.isdisjoint(TABLE.copy):
            return (0.0,) * self.ranks
        out = []
        for codes, st, en in zip(enc.codes, self.execution.action_starts, self.execution.action_ends):
            out.append(sum(e - s for c, s, e in zip(codes, st, en)
                           if s is not None and e is not None and _IS_COPY[c & KIND_MASK]))
        return tuple(out)

    @functools.cached_property
    def reload_waits(self) -> tuple[ReloadWait, ...]:
        """Each backward that started late because the reload of its activations had not
        ended (the copy lane was behind), in the order they ran."""
        enc = encode(self.program)
        out = []
        for rank, index, reload, waited in self.execution.reload_waits:
            steps = enc.steps[rank]
            step = index if steps is None else steps[index]
            at = reload if steps is None else steps[reload]
            out.append(ReloadWait(rank, step, str(self.program.rows[rank][step]), str(self.program.rows[rank][at]),
                                  waited))
        return tuple(out)

    @functools.cached_property
    def idle(self) -> tuple[float, ...]:
        """Per rank, the time neither computing nor communicating (nor copying, when the rank
        runs its offloads and reloads itself: `copy_lane=0`) (cached: reports index it per
        rank, which was ranks x ranks at 65,536 ranks)."""
        own = (0.0,) * len(self.busy) if self.costs.copy_lane else self.copy
        return tuple(max(0.0, self.makespan - b - c - o) for b, c, o in zip(self.busy, self.comm, own))

    @functools.cached_property
    def handoffs(self) -> int:
        """How many computes of the run took their input from another rank with no receive
        (a compute-only program): each waited a message time for it, in flight, on no rank."""
        enc = encode(self.program)
        hop = enc.needs(self.comm_model is CommModel.BUFFERED).input_hop
        if not any(map(any, hop)):
            return 0
        S, M = enc.stages, enc.microbatches
        # Whether code c's input hops, indexed by the code itself (-1, an out-of-range action,
        # reads the last entry: a kind that is no compute, False).
        crosses = [False] * code_space(S, M)
        for k, stages in enumerate(hop):
            for stage, hops in enumerate(stages):
                if hops:
                    crosses[kind_slice(stage, k, M)] = [True] * M
        count = 0
        for codes, steps, ends in zip(enc.codes, enc.steps, self.ends):
            if steps is None and (self.completed or None not in ends):  # all ran, one per step: in C
                count += sum(map(crosses.__getitem__, codes))
                continue
            count += sum(1 for i, c in enumerate(codes) if crosses[c] and ends[i if steps is None else steps[i]] is not None)
        return count

    @property
    def handoff_time(self) -> float:
        """The time `handoffs` spent in flight, all together (free messages: not counted)."""
        message = self.costs.message_time
        return self.handoffs * message if message else 0.0

    @functools.cached_property
    def memory(self) -> MemoryProfile:
        return profile(self.program, self._weights)

    @functools.cached_property
    def peak_memory(self) -> tuple[float, ...]:
        """Peak live activations per rank (the checker's memory model, `memory.py`), from the
        integer codes when one sign per kind says it (see `memory.peaks_from_codes`)."""
        fast = peaks_from_codes(encode(self.program), self._weights)
        if fast is None:
            return self.memory.peak
        return tuple(peak for peak, _ in fast)

    @functools.cached_property
    def peak_bytes(self) -> BytesProfile | None:
        """Per rank, peak bytes (state and live activations), when the costs carry sizes."""
        sizes = self.costs.sizes
        if sizes is None or sizes.stages != self.program.stages:
            return None
        return peak_bytes(self.program, sizes)

    @functools.cached_property
    def critical_path(self) -> tuple[PathStep, ...]:
        """A chain of steps, first to last, whose durations and waits add up to the makespan."""
        return critical_path(self.program, self.starts, self.ends, self.costs.message_time,
                             self.comm_model is not CommModel.BUFFERED)

    def as_json(self, path: str | None = None) -> dict[str, object]:
        out: dict[str, object] = {}
        if path is not None:
            out["file"] = path
        out.update({
            "completed": self.completed,
            "makespan": self.makespan,
            "bubble_ratio": self.bubble_ratio,
            "ranks": self.ranks,
            "stages": self.program.stages,
            "microbatches": self.program.microbatches,
            "comm_model": str(self.comm_model),
            "busy": list(self.busy),
            "comm": list(self.comm),
            "handoffs": self.handoffs,
            "handoff_time": self.handoff_time,
            "idle": list(self.idle),
            "copy": list(self.copy),
            "peak_memory": list(self.peak_memory),
            "memory_unit": UNIT if self._weights is None else "the given memory weights",
            **({} if self.peak_bytes is None else {"peak_bytes": list(self.peak_bytes.peak),
                                                  "state_bytes": list(self.peak_bytes.state),
                                                  "activation_bytes": list(self.peak_bytes.activations)}),
            "costs": self.costs.describe(self.program.stages),
            "unit": self.costs.unit,
            "critical_path": [{"rank": p.rank, "step": p.step, "action": p.text, "start": p.start, "end": p.end}
                              for p in self.critical_path],
        })
        if self.reload_waits:
            out["reload_waits"] = [{"rank": w.rank, "step": w.step, "action": w.action, "reload": w.reload,
                                    "waited": w.waited} for w in self.reload_waits]
        if not self.completed:
            out["waits"] = [{"rank": w.rank, "step": w.step, "action": str(w.action), "needs": w.needs,
                             "on_rank": w.on_rank, "reason": w.reason} for w in self.waits]
        return out


def simulate(program: Program, costs: CostModel | str | Mapping[str, float] | None = None, comm_model: CommModel | str = "rendezvous",
             memory_weights: Sequence[float] | None = None) -> Simulation:
    """Run `program` under `costs` (default: F=1, B=2, I=W=1, free messages) and a communication model.

    `costs` may also be written as `ppdsl simulate --costs` takes it (`"F=1,B=2"`) or as a
    mapping (`{"F": 1, "B": 2}`). Raises `costs.CostError` for a bad cost, or when a per-stage
    cost names a stage the program does not have.
    """
    require_program(program)
    model = CommModel(comm_model)
    if isinstance(costs, str):
        costs = parse_inline(costs)
    elif isinstance(costs, Mapping):
        costs = CostModel(costs)
    elif costs is not None and not isinstance(costs, CostModel):
        raise TypeError(f"costs must be a CostModel, a mapping such as {{'F': 1, 'B': 2}} or a string such as "
                        f"'F=1,B=2', not {type(costs).__name__}")
    cm = costs if costs is not None else (CostModel(program.costs) if program.costs else DEFAULT)
    execution = execute(program, model, cm.timing(program.stages, shares_of(program)))
    return Simulation(program, cm, model, execution, memory_weights)


def applying_to(program: Program) -> tuple[frozenset[str], bool]:
    """The compute kinds `program` has (names, `F`...) and whether it has an overlapped pair:
    the costs a report of it describes (`CostModel.describe`)."""
    enc = encode(program)
    kinds = frozenset(Kind(k).name for k in enc.kinds if k in COMPUTE_KINDS or TABLE.by_value[k].cost)
    return kinds, any(not is_batch for groups in enc.groups for is_batch, _ in groups.values())


def wait_text(w: Wait) -> str:
    """One wait of a stuck run, in words: which rank waits, at which action, for what from whom."""
    who = f"rank {w.on_rank}" if w.on_rank is not None else "no rank"
    what = {"peer": "its peer", "data": "data", "missing": "data nothing produces"}.get(w.reason, w.reason)
    return f"rank {w.rank} waits at step {w.step} ({w.action}) for {what} `{w.needs}` from {who}"


# How many waits a one-line summary of a stuck run names before a count of the rest.
SUMMARY_WAITS = 4


def waiting_forever(ranks: int) -> str:
    """`1 rank waits forever`, `2 ranks wait forever`."""
    return f"{plural(ranks, 'rank')} {'waits' if ranks == 1 else 'wait'} forever"


def stuck_summary(sim: Simulation) -> str:
    """Where a run that cannot finish stops, in one line: `rank 0 at 0B0 waits for `0F0` (rank 0); ...`.
    Figures of a stuck run (a makespan of the part that ran) would read as a result."""
    waits = sim.waits
    said = [f"rank {w.rank} at {w.action} waits for `{w.needs}`"
            + (f" (rank {w.on_rank})" if w.on_rank is not None else " (produced nowhere)") for w in waits[:SUMMARY_WAITS]]
    more = f"; and {plural(len(waits) - SUMMARY_WAITS, 'more rank')}" if len(waits) > SUMMARY_WAITS else ""
    return f"STUCK under {sim.comm_model}: " + "; ".join(said) + more


def stuck_diagnostic(sim: Simulation) -> Diagnostic:
    """Where a run that cannot finish stops: the wait-for cycle if there is one, else every wait."""
    program = sim.program
    cycle = wait_cycle(sim.waits)
    waits = cycle or list(sim.waits)
    first = waits[0]
    path, line, column, end = "<input>", 1, 1, None
    if program.source is not None:
        span = program.source.step_span(first.rank, first.step)
        path, line, column, end = program.source.path, span.line, span.column, span.end_column

    head = "a cycle of waits: " + " -> ".join(f"rank {w.rank}" for w in cycle) + f" -> rank {cycle[0].rank}" \
        if cycle else waiting_forever(len(waits))
    return Diagnostic("PPS353", f"the schedule cannot finish under `{sim.comm_model}`: {head}", path, line, column, end,
                      rank=first.rank, step=first.step,
                      notes=[wait_text(w) for w in waits],  # type: ignore[misc]  # attrs types converter=tuple badly
                      help="`ppdsl lint` explains the order to fix; other models: --comm-model grouped|buffered")
