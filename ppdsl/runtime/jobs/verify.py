"""`--verify`: the same model, data and weights run unpipelined in one process (rank 0).

After each pipelined step every rank hands its gradients (and the last stage its losses) to
rank 0, which runs all stages one microbatch after another, accumulating gradients the same
way, and compares: the losses and every parameter's gradient must agree within `rtol`
(max |a - b| over max |b|, per tensor). Its own optimizer then steps like the pipeline's, so
later steps compare from the same weights.

With N data-parallel replicas the unpipelined model runs the whole global batch, as N x M
microbatches: microbatch m of replica k is its microbatch k * M + m (replica k trains on the
k-th share of the batch). Every replica's gradients, averaged over the replicas, must equal it.
"""

from __future__ import annotations

from typing import Any

from ..interpreter import values
from ..interpreter.tied import LocalTies, equalize_local, sum_local
from .watchdog import Reporter


def relative_difference(a: Any, b: Any) -> float:
    import numpy as np

    a = np.asarray(a, dtype="float64")
    b = np.asarray(b, dtype="float64")
    if a.shape != b.shape:
        return float("inf")
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    diff = float(np.max(np.abs(a - b))) if b.size else 0.0
    return diff / scale if scale > 0 else diff


class Verifier:
    def __init__(self, cfg: Any, setup: Any, rank: int, world: int):
        from . import models
        from .models import build_stages, make_optimizer

        self.cfg = cfg
        self.setup = setup
        self.fw = setup.fw
        self.rank = rank
        self.failure: str | None = None
        self.worst = 0.0
        self.compared = 0
        self.steps = 0
        self.ref: dict[int, Any] = {}
        self.ties: LocalTies | None = None
        self.optimizer: Any = None
        if rank == 0:
            build = models.build_stage if cfg.model is None else models.load_callable(cfg.model, "model")
            stages = tuple(range(setup.program.stages))
            self.ref = build_stages(build, stages, setup.program.stages, cfg.seed, cfg.model or "built-in", self.fw)
            # Tied parameters start equal and share their gradients, as the pipeline's do.
            self.ties = equalize_local(self.fw, self.ref)
            params = [p for s in stages for _, p in self.fw.named_parameters(self.ref[s])]
            self.optimizer = make_optimizer(cfg.optimizer, cfg.lr, params, self.fw) if params else None

    def _mine(self, losses: list[Any]) -> tuple[dict[str, Any], list[float]]:
        grads = {}
        for s, layer in sorted(self.setup.layers.items()):
            for name, p in self.fw.named_parameters(layer):
                g = self.fw.grad_of(p)
                grads[f"stage{s}.{name}"] = None if g is None else self.fw.to_numpy(self.fw.whole(g))
        # The tensor-parallel ranks of the last stage all hold the losses: one of them tells.
        layout = getattr(self.setup, "layout", None)  # a set-up without one is a single pipeline
        told = layout is None or layout.tensor_rank == 0
        return grads, [float(v) for v in losses] if told else []

    def check_step(self, step: int, inputs: Any, target: Any, losses: list[Any]) -> None:
        from ..transport.comm import gather_objects

        fw = self.fw
        gathered = gather_objects(fw, self._mine(losses))
        if self.rank != 0 or self.failure is not None:
            return
        # Every replica holds each gradient: all are compared (a replica left out of the mean
        # would differ). Global ranks are replica-major, so losses come in the global batch's order.
        pipelined: dict[str, list[Any]] = {}
        pipe_losses: list[float] = []
        for grads, ls in gathered:
            for key, g in grads.items():
                pipelined.setdefault(key, []).append(g)
            pipe_losses.extend(ls)
        # The unpipelined model: every stage in order, microbatch by microbatch.
        N = self.cfg.data_parallel * self.cfg.fsdp  # every shard trains on its own share, as a replica
        M = self.setup.program.microbatches * N
        # The replicas' mean of their microbatches' sums (--sum-grads) is the global sum over N.
        scale = 1.0 / M if self.cfg.scale_grads else 1.0 / N
        xs = values.split_batch(fw, inputs, M, "inputs")
        ts = values.split_batch(fw, target, M, "target")
        ref_losses = []
        for x, t in zip(xs, ts):
            for s in range(self.setup.program.stages):
                x = values.call(self.ref[s], x)
            loss = self.setup.loss_fn(x, t)
            ref_losses.append(float(fw.detach(loss)))
            fw.backward([loss * scale if scale != 1.0 else loss], None)
        if self.ties is not None:
            sum_local(self.ties)
        self.steps += 1
        if len(pipe_losses) != len(ref_losses):
            self.failure = f"step {step}: the pipeline produced {len(pipe_losses)} losses, expected {len(ref_losses)}"
            return
        for m, (a, b) in enumerate(zip(pipe_losses, ref_losses)):
            d = relative_difference(a, b)
            self.worst = max(self.worst, d)
            if d > self.cfg.rtol:
                self.failure = f"step {step}: loss of microbatch {m} is {a!r}, unpipelined {b!r} (relative {d:.2e})"
                return
        for s in range(self.setup.program.stages):
            for name, p in fw.named_parameters(self.ref[s]):
                key = f"stage{s}.{name}"
                g = fw.grad_of(p)
                want = None if g is None else fw.to_numpy(g)
                copies = pipelined.get(key, [])
                if len(copies) != N * self.cfg.tp:  # every tensor rank holds it, gathered whole
                    self.failure = (f"step {step}: gradient of {key}: the pipeline holds {len(copies)} "
                                    f"of it, expected one per replica and tensor rank ({N * self.cfg.tp})")
                    return
                for replica, got in enumerate(copies):
                    where = f" on replica {replica // self.cfg.tp}" if N > 1 else ""
                    if self.cfg.tp > 1:
                        where += f" (tensor rank {replica % self.cfg.tp})"
                    if (got is None) != (want is None):
                        self.failure = f"step {step}: gradient of {key}{where}: pipeline has " \
                                       f"{'none' if got is None else got}, unpipelined has {'none' if want is None else 'one'}"
                        return
                    if want is None:
                        continue
                    d = relative_difference(got, want)
                    self.compared += 1
                    self.worst = max(self.worst, d)
                    if d > self.cfg.rtol:
                        self.failure = (f"step {step}: gradient of {key}{where} differs from the unpipelined model "
                                        f"(max relative difference {d:.2e} > {self.cfg.rtol:g})")
                        return

    def clip(self, step: int, max_norm: float, pipelined: float) -> None:
        """Clip the unpipelined model's gradients as the pipeline clipped its own, and compare
        the two norms (rank 0)."""
        if self.rank != 0:
            return
        from ..interpreter.clipping import clip_grad_norm

        norm = clip_grad_norm(self.fw, self.ref.values(), max_norm, lambda x: [x], 1,
                              self.ties.others() if self.ties is not None else ())
        d = relative_difference(pipelined, norm)
        self.worst = max(self.worst, d)
        if self.failure is None and d > self.cfg.rtol:
            self.failure = (f"step {step}: the global gradient norm is {pipelined!r}, unpipelined {norm!r} "
                            f"(relative {d:.2e})")

    def optimizer_step(self, skipped: bool = False) -> None:
        if self.optimizer is not None:
            if skipped:
                self.fw.clear_grads(self.optimizer)
                return
            # The reference runs on rank 0 alone: a collective in the optimizer's step would
            # wait for peers that are elsewhere (or meet their next messages). Refused, said.
            spec = self.cfg.optimizer

            def why(name: str) -> str:
                return (f"--verify: the optimizer `{spec}` calls {name}() in its step, but --verify's unpipelined "
                        "reference steps its optimizer on rank 0 alone, where a collective has no peers: run "
                        "without --verify, or verify with an optimizer whose step makes no collective call")

            with self.fw.collectives_refused(why):
                self.fw.optimizer_step(self.optimizer)

    def finish(self, reporter: Reporter, file: int = 0) -> None:
        if self.rank != 0:
            return
        reporter.send("verify", file=file, ok=self.failure is None, message=self.failure or "", worst=self.worst,
                      steps=self.steps, tensors=self.compared)
        if not reporter.attached:
            print(f"verify: {'FAILED: ' + self.failure if self.failure else 'ok'} "
                  f"(worst relative difference {self.worst:.2e})", flush=True)
