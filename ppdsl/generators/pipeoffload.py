"""PipeOffload's selective offload (Wan et al., ICML 2025): interleaved 1F1B whose first model
chunks keep their activations in host memory between forward and backward.

Rank r holds v = `virtual` chunks (stage c*p + r is its chunk c, loop placement), in the order
of `interleaved_1f1b`. Chunk 0's activations live longest (its forwards run first, its
backwards last), so offloading chunk by chunk from the first frees the most per byte moved:
with `chunks=k`, every microbatch of chunks 0..k-1 is offloaded right after its forward and
reloaded one action before its first backward (a copy lane then hides the reload behind that
action), but for the last stage, whose backward starts from its forward's own loss, most often
the very next action: moving those would free nothing. `chunks=v` is the paper's full offload. The authors' code (the repository
sail-sg/zero-bubble-pipeline-parallelism, `scheduler/offloading.py`) also drops an offload
whose activations would come back too soon to be worth moving; here every one is kept, so the
memory figures are the rule's own.

Memory at unit costs, in microbatches of a chunk's activations on rank 0 (the peak rank),
p = 16, v = 2, m = 64: interleaved 1F1B 47 ((v+1)p - 1); offloading chunk 0 leaves the
warm-up of chunk 1 and the reloads (about p + 1); offloading both about 2, whatever p
(`tests/generators/test_pipeoffload.py` holds these).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..ir import Action, Kind, Step
from .interleaved import build as interleaved
from .registry import ArgValue, Built, GeneratorSpec, Param, require


def offloaded(row: tuple[Step, ...], ranks: int, virtual: int, chunks: int) -> tuple[Step, ...]:
    """`row` with an `OFFLOAD` after each forward of a chunk below `chunks` (stage s is chunk
    s // ranks) and its `RELOAD` one action before its first backward."""
    forward: dict[tuple[int, int], int] = {}
    first_back: dict[tuple[int, int], int] = {}
    for i, step in enumerate(row):
        if isinstance(step, Action) and step.microbatch is not None:
            if step.kind is Kind.F:
                forward[(step.stage, step.microbatch)] = i
            elif step.kind is Kind.B:
                first_back.setdefault((step.stage, step.microbatch), i)
    moved: set[tuple[int, int]] = set()
    reload_at: dict[int, list[Step]] = {}
    last = ranks * virtual - 1
    for key, i in first_back.items():
        f = forward.get(key)
        # The last stage's backward starts from its own forward's loss, most often the very
        # next action: moving its activations would free nothing. It keeps them.
        if key[0] // ranks < chunks and key[0] != last and f is not None:
            moved.add(key)
            reload_at.setdefault(i - 1 if i - 1 > f else i, []).append(Action(key[0], Kind.RELOAD, key[1]))
    out: list[Step] = []
    for i, step in enumerate(row):
        out.extend(reload_at.get(i, ()))
        out.append(step)
        if isinstance(step, Action) and step.kind is Kind.F and (step.stage, step.microbatch) in moved:
            out.append(Action(step.stage, Kind.OFFLOAD, step.microbatch))
    return tuple(out)


def build(ranks: int, microbatches: int, args: Mapping[str, ArgValue]) -> Built:
    virtual, chunks = int(args["virtual"]), int(args["chunks"])
    require(chunks <= virtual, f"chunks={chunks}: a rank holds {virtual} chunks (virtual={virtual})", "chunks",
            help=f"chunks=0..{virtual}; chunks={virtual} offloads every chunk")
    built = interleaved(ranks, microbatches, {"virtual": virtual})
    return Built(tuple(offloaded(row, ranks, virtual, chunks) for row in built.rows), built.stages, built.placement)


def count(ranks: int, microbatches: int, args: Mapping[str, ArgValue], inference: bool) -> int:
    """A forward and a backward a (stage, microbatch), and an `OFFLOAD` and a `RELOAD` for each
    one moved: every microbatch of the stages of the first `chunks` chunks but the last stage."""
    virtual, chunks = int(args["virtual"]), min(int(args["chunks"]), int(args["virtual"]))
    stages = ranks * virtual
    if inference:
        return stages * microbatches
    moved = ranks * chunks - (1 if chunks == virtual else 0)
    return 2 * stages * microbatches + 2 * moved * microbatches


SPEC = GeneratorSpec(
    name="pipeoffload",
    summary="PipeOffload's selective offload: interleaved 1F1B, the first `chunks` of each rank's chunks offloaded",
    placement="loop, `virtual` stages per rank",
    build=build,
    steps=count,
    params=(Param("virtual", int, 2, "model chunks (stages) per rank", minimum=1),
            Param("chunks", int, 1, "how many of each rank's chunks, from the first, offload every microbatch",
                  minimum=0)),
    reference="Wan et al., PipeOffload: Improving Scalability of Pipeline Parallelism with Memory Optimization "
              "(ICML 2025); sail-sg/zero-bubble-pipeline-parallelism, scheduler/offloading.py",
)
