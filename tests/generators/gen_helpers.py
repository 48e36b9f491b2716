"""Build generator programs and judge them with the checker and the simulator, plus a
completeness test of our own (independent of the checker's)."""

from __future__ import annotations

from collections import Counter

from ppdsl.check import check
from ppdsl.diagnostics import Severity
from ppdsl.generators import registry
from ppdsl.ir import Kind, Program
from ppdsl.semantics import Timing, execute
from ppdsl.simulate import simulate


def build(name: str, ranks: int, microbatches: int, **args: object) -> Program:
    built = registry.expand(name, ranks, microbatches, args)
    return Program(ranks, built.stages, microbatches, built.placement, built.rows)


def problems(program: Program) -> list[str]:
    """Every reason `program` is not a sound schedule; empty when it is."""
    out = completeness(program)
    out += [f"{d.code}: {d.message}" for d in check(program, comm_model="rendezvous")
            if d.severity is Severity.ERROR]
    return out


def completeness(program: Program) -> list[str]:
    """Each (stage, microbatch) has one F and either one B or one I and one W, on its rank."""
    out: list[str] = []
    seen: Counter[tuple[int, int, Kind]] = Counter()
    for rank, _, a in program.actions():
        if a.microbatch is None:
            continue
        seen[(a.stage, a.microbatch, a.kind)] += 1
        if program.placement[a.stage] != rank:
            out.append(f"{a} on rank {rank}, but stage {a.stage} is placed on rank {program.placement[a.stage]}")
    for s in range(program.stages):
        for m in range(program.microbatches):
            f, b, i, w = (seen[(s, m, k)] for k in (Kind.F, Kind.B, Kind.I, Kind.W))
            if f != 1 or not ((b == 1 and i == w == 0) or (b == 0 and i == w == 1)):
                out.append(f"stage {s} microbatch {m}: F x{f}, B x{b}, I x{i}, W x{w}")
    return out


def measure(program: Program) -> tuple[float, float, tuple[float, ...]]:
    """(makespan, bubble ratio, peak memory per rank) under unit costs: F=I=W=1, B=2."""
    sim = simulate(program)
    return sim.makespan, sim.bubble_ratio, tuple(sim.peak_memory)


def rank_span_idle(program: Program) -> list[float]:
    """Per rank, idle time between its first start and its last end (unit costs)."""
    run = execute(program, "rendezvous", Timing(compute=lambda a: 2.0 if a.kind is Kind.B else 1.0))
    out = []
    for starts, ends in zip(run.starts, run.ends):
        pairs = [(s, e) for s, e in zip(starts, ends) if s is not None and e is not None]
        busy = sum(e - s for s, e in pairs)
        out.append(max(e for _, e in pairs) - min(s for s, _ in pairs) - busy)
    return out
