"""Averaging a stage's gradients over its data-parallel replicas, beside compute.

Once a stage's last backward action of the step has run (`plan.last_backward`), its gradients
are final for this replica: they are copied into a few flat buffers (buckets, one collective
each instead of one per parameter) on the compute thread, and the buckets are summed over the
stage's replicas on a `Background` thread, while the rank goes on with its other actions. The
step waits for them at its end, then writes the mean back into each parameter's gradient, so
the user's optimizer sees the gradients of the whole global batch.

Every replica of a pipeline rank runs the same plan, so its stages post their reductions in
the same order on the same data-parallel group: the collectives line up without a word.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..transport.background import Background
from ..errors import PeerError
from ..framework import Framework
from ..jobs.watchdog import Lane, Watchdog

# The most bytes one collective carries (PyTorch DDP's default bucket is 25 MiB): large enough
# that a stage's buckets are few, small enough that the first bucket's sum can start while
# the stage's other buckets are still being copied, when a backend overlaps them.
BUCKET_BYTES = 25 << 20
CLOSE_SECONDS = 5.0  # the thread is idle after a step's wait: it ends at once


def lost(who: str, doing: str, exc: RuntimeError) -> PeerError:
    """A collective that failed in the background: a member died or was stopped (the
    framework's message says which, in its words, cut to its first line)."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    return PeerError(f"lost {who} while {doing} ({first}): one of them died or was stopped")


class Bucket:
    """Parameters of one dtype whose gradients travel in one flat buffer."""

    def __init__(self, params: list[Any]):
        self.params = params
        self.flat: Any = None


def buckets_of(fw: Framework, params: list[Any], cap: int = BUCKET_BYTES) -> list[Bucket]:
    """`params` in order, cut into buckets of one dtype and at most `cap` bytes (a parameter
    larger than `cap` is a bucket alone). Every replica builds the same buckets from the same
    model, so their collectives have the same sizes."""
    out: list[Bucket] = []
    open_: dict[str, tuple[Bucket, int]] = {}
    for p in params:
        dtype = fw.dtype_name(p)
        size = fw.nbytes(p)
        current = open_.get(dtype)
        if current is None or current[1] + size > cap:
            bucket = Bucket([])
            out.append(bucket)
            current = (bucket, 0)
        current[0].params.append(p)
        open_[dtype] = (current[0], current[1] + size)
    return out


class GradientReducer:
    """Posts each stage's reduction when its backward is done; `wait` writes the means back."""

    def __init__(self, fw: Framework, layers: Mapping[int, Any], all_reduce: Callable[[Any], None], replicas: int,
                 watchdog: Watchdog, ranks: list[int], skip: set[int] | frozenset[int] = frozenset()):
        self.fw = fw
        self.all_reduce = all_reduce  # sums a flat buffer over the replicas, in place
        self.replicas = replicas
        self.ranks = ranks
        # `skip`: ids of parameters reduced elsewhere (tied copies: `tied.py`).
        self.buckets = {s: buckets_of(fw, [p for p in fw.trainable(layer) if id(p) not in skip])
                        for s, layer in layers.items()}
        self.background = Background("grad-reduce", watchdog.lane())
        self._posted: list[int] = []

    def post(self, stage: int) -> None:
        """Stage `stage`'s gradients are final on this replica: start summing them."""
        fw = self.fw
        buckets = self.buckets[stage]
        for b in buckets:
            # An unused parameter has no gradient yet: it counts as zero (every replica's
            # buckets keep their sizes).
            # A tensor-parallel rank averages its own part of a split gradient.
            b.flat = fw.flatten([fw.local(g) if (g := fw.grad_of(p)) is not None else fw.zeros_like(fw.local(p))
                                 for p in b.params])
        label = f"reducing stage {stage}'s gradients over {self.replicas} replicas"
        with_ranks = f"all-reducing with ranks {', '.join(map(str, self.ranks))}"

        def job(lane: Lane | None) -> None:
            for b in buckets:
                if lane is not None:
                    lane.arm(label, with_ranks)
                try:
                    self.all_reduce(b.flat)
                except RuntimeError as exc:
                    raise lost("a replica", with_ranks, exc) from None

        self.background.post(job, label)
        self._posted.append(stage)

    def wait(self) -> None:
        """Every posted reduction done: each gradient is now the mean over the replicas.
        Raises `JobFailed` (with the label of the stage's reduction) when one failed."""
        self.background.wait()
        scale = 1.0 / self.replicas
        for stage in self._posted:
            for b in self.buckets[stage]:
                self.fw.unflatten_into(b.flat, [None if (g := self.fw.grad_of(p)) is None else self.fw.local(g)
                                                for p in b.params], scale)
                b.flat = None
        self._posted.clear()

    def close(self) -> None:
        self.background.join(CLOSE_SECONDS)
