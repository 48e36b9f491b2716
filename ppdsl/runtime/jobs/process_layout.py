"""Where a process sits when a pipeline is replicated for data parallelism.

`replicas` copies of a `pipeline`-rank pipeline run side by side, each on its own share of
every batch. Global ranks are numbered replica-major, the order of fleet's
`CommunicateTopology` with the "data" axis outside the "pipe" axis: pipeline rank r of
replica k is global rank k * pipeline + r. So replica 0 is global ranks 0..P-1, as a job of one
replica is today, and a pipeline rank's replicas are P apart.

With `shards` N (FSDP), every N consecutive replicas form one sharding group: each of them
trains on its own share of the batch as a replica does, and each stage's weights are sharded
over the group (gathered by `UNSHARD`, gradients reduce-scattered by `REDUCE_GRAD`). With
`replicas` R = D x N, the job is D copies of a sharded pipeline (torch's HSDP): replica k is
copy k // N, shard k % N, and a stage's mesh is D x N ranks (`shard_mesh`).

With `tensor` T (tensor parallelism), each stage's layers are split over T consecutive global
ranks, which train on the same rows: global rank (k * P + r) * T + t is tensor rank t of
pipeline rank r of replica k. With T = 1 the numbering above is unchanged.

No framework here: the launcher and the checks before any process starts read it too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attrs import Attribute, field, frozen

from ...diagnostics import UsageError
from ...wording import plural


def _at_least_one(_: object, attribute: Attribute[int], value: int) -> None:
    if value < 1:
        raise UsageError(f"a layout's {attribute.name} must be at least 1, not {value}")


@frozen
class Layout:
    """Pipeline size, replica count (every data-parallel member, sharded or not), this
    process's global rank, and how many consecutive replicas shard each stage (1: none)."""

    pipeline: int = field(validator=_at_least_one)
    replicas: int = field(default=1, validator=_at_least_one)
    rank: int = 0
    shards: int = field(default=1, validator=_at_least_one)
    tensor: int = field(default=1, validator=_at_least_one)

    def __attrs_post_init__(self) -> None:
        if self.shards > 1 and self.tensor > 1:
            raise UsageError("a layout shards stages (FSDP) or splits them over tensor-parallel ranks, not both yet")
        if self.replicas % self.shards:
            raise UsageError(f"a layout of {plural(self.replicas, 'replica')} cannot be cut into sharding groups "
                             f"of {self.shards}")
        if not 0 <= self.rank < self.world:
            tp = f" x {self.tensor} tensor-parallel ranks" if self.tensor > 1 else ""
            raise UsageError(f"global rank {self.rank} is outside a layout of {plural(self.pipeline, 'pipeline rank')} "
                             f"x {plural(self.replicas, 'replica')}{tp} ({self.world} processes)")

    @classmethod
    def single(cls, pipeline: int, rank: int) -> Layout:
        """One replica: global ranks are pipeline ranks (a job without data parallelism)."""
        return cls(pipeline, 1, rank)

    @property
    def world(self) -> int:
        return self.pipeline * self.replicas * self.tensor

    @property
    def replica(self) -> int:
        return self.replica_of(self.rank)

    def replica_of(self, rank: int) -> int:
        """The replica global rank `rank` belongs to."""
        return rank // (self.pipeline * self.tensor)

    @property
    def pipeline_rank(self) -> int:
        return self.pipeline_rank_of(self.rank)

    def pipeline_rank_of(self, rank: int) -> int:
        """The pipeline rank global rank `rank` holds."""
        return (rank // self.tensor) % self.pipeline

    @property
    def tensor_rank(self) -> int:
        """This process's place in its stages' tensor-parallel group (0 without one)."""
        return self.rank % self.tensor

    def tensor_ranks(self) -> list[int]:
        """The global ranks this process's stages are split over (itself alone without tensor parallelism)."""
        first = self.rank - self.tensor_rank
        return list(range(first, first + self.tensor))

    def global_rank(self, pipeline_rank: int, replica: int | None = None) -> int:
        """Pipeline rank `pipeline_rank` of `replica` (default: this process's replica), at this
        process's tensor rank."""
        k = self.replica if replica is None else replica
        return (k * self.pipeline + pipeline_rank) * self.tensor + self.tensor_rank

    def _at(self, pipeline_rank: int, replica: int, tensor_rank: int) -> int:
        return (replica * self.pipeline + pipeline_rank) * self.tensor + tensor_rank

    def pair_groups(self, pairs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """Every replica's (and tensor rank's) copy of the pipeline's communicating pairs, in
        global ranks, in the order every process creates their groups: replica by replica,
        tensor rank by tensor rank, each in pair order."""
        return [(self._at(a, k, t), self._at(b, k, t)) for k in range(self.replicas) for t in range(self.tensor)
                for a, b in pairs]

    def data_parallel_ranks(self, pipeline_rank: int, tensor_rank: int | None = None) -> list[int]:
        """The global ranks holding `pipeline_rank` (at `tensor_rank`, default this process's)
        in every replica: its data-parallel group."""
        t = self.tensor_rank if tensor_rank is None else tensor_rank
        return [self._at(pipeline_rank, k, t) for k in range(self.replicas)]

    def data_parallel_groups(self) -> list[list[int]]:
        """One group per pipeline rank and tensor rank, in that order (created so by every process)."""
        return [self.data_parallel_ranks(r, t) for r in range(self.pipeline) for t in range(self.tensor)]

    @property
    def sharded(self) -> bool:
        return self.shards > 1

    def shard_mesh(self, pipeline_rank: int | None = None) -> list[list[int]]:
        """The global ranks over which `pipeline_rank`'s stages are sharded (default: this
        process's), as a (copies, shards) grid: one row per copy of the sharded pipeline."""
        r = self.pipeline_rank if pipeline_rank is None else pipeline_rank
        n = self.shards
        return [[self.global_rank(r, d * n + s) for s in range(n)] for d in range(self.replicas // n)]

    def share(self, rows: int) -> tuple[int, int]:
        """The [start, stop) rows of a global batch of `rows` that this replica trains on."""
        per = rows // self.replicas
        return self.replica * per, (self.replica + 1) * per


def check_world(pipeline: int, replicas: int, world: int, shards: int = 1, tensor: int = 1) -> None:
    """UsageError unless a job of `world` processes holds `replicas` copies of a `pipeline`-rank
    pipeline (`shards` of them per sharding group: `--fsdp`), each stage split over `tensor`
    ranks (`--tp`)."""
    if pipeline * replicas * tensor != world:
        given = f"--data-parallel is {replicas // shards} and --fsdp {shards}" if shards > 1 \
            else f"--data-parallel is {replicas}"
        given += f" and --tp {tensor}" if tensor > 1 else ""
        each = replicas * tensor
        raise UsageError(f"the schedule has {plural(pipeline, 'rank')} and {given}, so the job "
                         f"needs {pipeline} x {each} = {pipeline * each} processes, but "
                         f"{plural(world, 'process')} {'was' if world == 1 else 'were'} started")


def batch_splits(rows: int, microbatches: int) -> list[int]:
    """The data-parallel degrees a batch of `rows` splits into, each replica taking
    `microbatches` microbatches of equal rows."""
    return [n for n in range(1, rows + 1) if rows % (n * microbatches) == 0]


def layout_of_fleet(topology: Any, rank: int) -> Layout:
    """The layout of a Paddle fleet job for global rank `rank`, from its
    `CommunicateTopology` (or a `HybridCommunicateGroup`, whose `topology()` it reads).

    Only the "pipe" and "data" axes may be larger than 1, and fleet's numbering must be this
    layout's ("data" outside "pipe", fleet's default order): UsageError, naming what differs, if not."""
    topo = topology.topology() if hasattr(topology, "topology") else topology
    dims = {str(name): int(topo.get_dim(name)) for name in topo.get_hybrid_group_names()}
    wider = {name: n for name, n in dims.items() if n > 1 and name not in ("pipe", "data")}
    if wider:
        raise UsageError("ppdsl replicates the pipeline over the data axis only; this fleet topology also has "
                         + ", ".join(f"{name} degree {n}" for name, n in wider.items()))
    layout = Layout(dims.get("pipe", 1), dims.get("data", 1), rank)
    coord = topo.get_coord(rank)
    stage, replica = int(getattr(coord, "pipe", 0)), int(getattr(coord, "data", 0))
    if (stage, replica) != (layout.pipeline_rank, layout.replica):
        raise UsageError(f"fleet puts global rank {rank} at pipe {stage} of data {replica}, but ppdsl's layout "
                         f"(data outside pipe) at pipeline rank {layout.pipeline_rank} of replica {layout.replica}: "
                         "order the topology's axes with data before pipe")
    return layout
