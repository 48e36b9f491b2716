"""Pipeline x data parallelism with fleet's topology: a `CommunicateTopology` gives the layout.

    python -m paddle.distributed.launch --nproc_per_node 4 examples/fleet_hybrid/train.py [SCHEDULE] [STEPS]

Fleet numbers a hybrid job's ranks with "data" outside "pipe" (its default order), which is
`Layout`'s numbering: `layout_of_fleet` reads the sizes and this process's place from the
topology and checks that they agree. The topology is pure Python; on a GPU job pass
`fleet.get_hybrid_communicate_group()` instead (its `topology()` is read). On CPU with gloo,
`fleet.init` with a hybrid strategy fails while it creates its groups (several at once break
each other's connection set-up), so this example joins the job with `init_parallel_env`.
The schedule runs on ppdsl's own pair and data-parallel groups, each replica on its share of
every batch, and SGD steps on the gradients averaged over the replicas.
"""

from __future__ import annotations

import sys

import paddle
import paddle.distributed as dist
from paddle.distributed.fleet.base.topology import CommunicateTopology

from ppdsl.load import load_program
from ppdsl.runtime import PipelineSchedule, layout_of_fleet, models

PIPELINE, REPLICAS = 2, 2


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else None
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    dist.init_parallel_env()
    topology = CommunicateTopology(["data", "pipe", "sharding", "sep", "model"], [REPLICAS, PIPELINE, 1, 1, 1])
    layout = layout_of_fleet(topology, dist.get_rank())
    program = load_program(path) if path else load_program(text_path())
    stages = models.build_stages(models.build_stage, program.stages_of(layout.pipeline_rank), program.stages,
                                 seed=0, name="built-in")
    sched = PipelineSchedule(program, stages, models.loss, layout=layout, timeout=60)
    params = [p for s in sorted(stages) for p in stages[s].parameters()]
    optimizer = paddle.optimizer.SGD(learning_rate=0.05, parameters=params)
    batches = models.synthetic_batches(program.microbatches * layout.replicas)
    for step in range(steps):
        x, y = next(batches)  # the global batch; this replica trains on its rows
        start, stop = layout.share(int(x.shape[0]))
        losses: list[paddle.Tensor] = []
        sched.step(x[start:stop], target=y[start:stop], losses=losses)
        optimizer.step()
        optimizer.clear_grad()
        if losses:
            mean = float(sum(float(v) for v in losses) / len(losses))
            print(f"replica {layout.replica} step {step + 1}/{steps}: loss {mean:.6f}", flush=True)
    sched.close()


def text_path() -> str:
    """The default schedule, 1F1B on the pipeline's ranks, written next to the logs."""
    import tempfile

    f = tempfile.NamedTemporaryFile("w", suffix=".pps", delete=False)
    f.write(f"pipeline ranks={PIPELINE} microbatches=4\nuse 1f1b()\n")
    f.close()
    return f.name


if __name__ == "__main__":
    main()
