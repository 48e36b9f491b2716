"""Each rank builds a PipelineSchedule from a different file: both must refuse together.

With `--guard-mix FILE`, both ranks use FILE but rank 1 turns the label guard off."""

from __future__ import annotations

import json
import sys

from ppdsl.load import load_program
from ppdsl.runtime import PipelineSchedule, SetupError, init_from_env, models

rank = init_from_env()
mix = sys.argv[1] == "--guard-mix"
program = load_program(sys.argv[2] if mix else sys.argv[1 + rank])
layers = {s: models.build_stage(s, program.stages) for s in program.stages_of(rank)}
try:
    PipelineSchedule(program, layers, models.loss, timeout=20, _guard=not (mix and rank == 1))
    print(json.dumps({"rank": rank, "error": None}))
    sys.exit(0)
except SetupError as exc:
    print(json.dumps({"rank": rank, "error": str(exc)}))
    sys.exit(1)
