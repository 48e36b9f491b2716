"""One rank of the grouped-path test: the same file and model run through the interpreter's
NCCL code path (batches posted as one batch_isend_irecv, headers batched) and its gloo path,
in the same 2 gloo processes; prints both sides' losses and gradients.

The file's batches meet their peers in written order, so gloo's in-order batch runs them.
    argv: SCHEDULE_FILE
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import values_model  # noqa: E402
from ppdsl.load import load_program  # noqa: E402
from ppdsl.runtime import PipelineSchedule, init_from_env  # noqa: E402

rank = init_from_env()
program = load_program(sys.argv[1])
record = {}
for backend in ("nccl", "gloo"):
    import paddle

    layers = {}
    for s in program.stages_of(rank):
        paddle.seed(s)
        layers[s] = values_model.build_stage(s, program.stages)
    schedule = PipelineSchedule(program, layers, values_model.loss, timeout=30, backend=backend)
    data = values_model.batches(program.microbatches * 2)
    steps = []
    for _ in range(2):
        x, y = next(data)
        losses: list[object] = []
        schedule.step(x, target=y, losses=losses)
        steps.append({"losses": [float(v) for v in losses],  # type: ignore[arg-type]
                      "grads": [p.grad.numpy().tolist() for s in sorted(layers) for p in layers[s].parameters()]})
        for layer in layers.values():
            layer.clear_gradients(set_to_zero=False)
    record[backend] = steps
print("RESULT " + json.dumps(record), flush=True)
