"""Where a process sits when a pipeline is replicated for data parallelism.

`replicas` copies of a `pipeline`-rank pipeline run side by side, each on its own share of
every batch. Global ranks are numbered replica-major, the order of fleet's
`CommunicateTopology` with the "data" axis outside the "pipe" axis: pipeline rank r of
replica k is global rank k * pipeline + r. So replica 0 is global ranks 0..P-1, as a job of one
replica is today, and a pipeline rank's replicas are P apart.

No framework here: the launcher and the checks before any process starts read it too.
"""

from __future__ import annotations

from collections.abc import Sequence

from attrs import Attribute, field, frozen

from ..diagnostics import UsageError
from ..english import plural


def _at_least_one(_: object, attribute: Attribute[int], value: int) -> None:
    if value < 1:
        raise UsageError(f"a layout's {attribute.name} must be at least 1, not {value}")


@frozen
class Layout:
    """Pipeline size, replica count and this process's global rank."""

    pipeline: int = field(validator=_at_least_one)
    replicas: int = field(default=1, validator=_at_least_one)
    rank: int = 0

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.rank < self.world:
            raise UsageError(f"global rank {self.rank} is outside a layout of {plural(self.pipeline, 'pipeline rank')} "
                             f"x {plural(self.replicas, 'replica')} ({self.world} processes)")

    @classmethod
    def single(cls, pipeline: int, rank: int) -> Layout:
        """One replica: global ranks are pipeline ranks (a job without data parallelism)."""
        return cls(pipeline, 1, rank)

    @property
    def world(self) -> int:
        return self.pipeline * self.replicas

    @property
    def replica(self) -> int:
        return self.rank // self.pipeline

    @property
    def pipeline_rank(self) -> int:
        return self.rank % self.pipeline

    def global_rank(self, pipeline_rank: int, replica: int | None = None) -> int:
        """Pipeline rank `pipeline_rank` of `replica` (default: this process's replica)."""
        return (self.replica if replica is None else replica) * self.pipeline + pipeline_rank

    def pair_groups(self, pairs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """Every replica's copy of the pipeline's communicating pairs, in global ranks, in the
        order every process creates their groups: replica by replica, each in pair order."""
        return [(self.global_rank(a, k), self.global_rank(b, k)) for k in range(self.replicas) for a, b in pairs]

    def data_parallel_ranks(self, pipeline_rank: int) -> list[int]:
        """The global ranks holding `pipeline_rank` in every replica: its data-parallel group."""
        return [self.global_rank(pipeline_rank, k) for k in range(self.replicas)]

    def data_parallel_groups(self) -> list[list[int]]:
        """One group per pipeline rank, in pipeline-rank order (created so by every process)."""
        return [self.data_parallel_ranks(r) for r in range(self.pipeline)]

    def share(self, rows: int) -> tuple[int, int]:
        """The [start, stop) rows of a global batch of `rows` that this replica trains on."""
        per = rows // self.replicas
        return self.replica * per, (self.replica + 1) * per


def check_world(pipeline: int, replicas: int, world: int) -> None:
    """UsageError unless a job of `world` processes holds `replicas` copies of a `pipeline`-rank pipeline."""
    if pipeline * replicas != world:
        raise UsageError(f"the schedule has {plural(pipeline, 'rank')} and --data-parallel is {replicas}, so the job "
                         f"needs {pipeline} x {replicas} = {pipeline * replicas} processes, but "
                         f"{plural(world, 'process')} {'was' if world == 1 else 'were'} started")


def batch_splits(rows: int, microbatches: int) -> list[int]:
    """The data-parallel degrees a batch of `rows` splits into, each replica taking
    `microbatches` microbatches of equal rows."""
    return [n for n in range(1, rows + 1) if rows % (n * microbatches) == 0]
