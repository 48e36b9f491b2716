"""A training loop that uses ppdsl's Python API directly (no `ppdsl run`).

Start one process per rank. Locally, with Paddle's launcher:

    python -m paddle.distributed.launch --nproc_per_node 2 examples/train_loop.py tests/runtime/schedules/2r_zb_iw.pps

or with plain environment variables (what `ppdsl run` does), e.g. for rank 0 of 2:

    PADDLE_TRAINERS_NUM=2 PADDLE_TRAINER_ENDPOINTS=127.0.0.1:6170,127.0.0.1:6171 \
    PADDLE_TRAINER_ID=0 PADDLE_CURRENT_ENDPOINT=127.0.0.1:6170 PADDLE_DISTRI_BACKEND=gloo \
    python examples/train_loop.py my_schedule.pps
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import paddle  # noqa: E402

import my_model  # noqa: E402
from ppdsl.load import load_program  # noqa: E402
from ppdsl.runtime import PipelineSchedule, init_from_env  # noqa: E402


def main(path: str, steps: int = 20) -> None:
    rank = init_from_env()
    program = load_program(path)
    # The stages this rank holds (two per rank for interleaved or V schedules).
    stages = {}
    for s in program.stages_of(rank):
        paddle.seed(s)  # the same initial weights for a stage whichever process builds it
        stages[s] = my_model.build_stage(s, program.stages)
    schedule = PipelineSchedule(program, stages, my_model.loss, timeout=60)
    params = [p for layer in stages.values() for p in layer.parameters()]
    optimizer = paddle.optimizer.Adam(learning_rate=1e-3, parameters=params)
    data = my_model.batches()
    for step in range(steps):
        inputs, targets = next(data)
        losses: list[paddle.Tensor] = []
        schedule.step(inputs, target=targets, losses=losses)  # only the first/last stage use them
        optimizer.step()
        optimizer.clear_grad()
        if losses:  # the rank that holds the last stage
            print(f"step {step}: loss {float(sum(losses)) / len(losses):.4f}", flush=True)
    # Evaluation: the same schedule's forwards only, under no gradient; every rank calls it.
    for layer in stages.values():
        layer.eval()
    inputs, targets = next(data)
    held_out: list[paddle.Tensor] = []
    outputs = schedule.eval(inputs, target=targets, losses=held_out)
    if outputs is not None:  # the rank that holds the last stage
        print(f"eval: loss {float(sum(held_out)) / len(held_out):.4f} on {outputs.shape[0]} samples", flush=True)
    schedule.close()  # ends its sending threads before the process exits


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20)
