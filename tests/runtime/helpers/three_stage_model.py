"""A model that can only be cut into three stages: for the stage-count test."""

from __future__ import annotations

import paddle

from ppdsl.runtime.jobs import models

NUM_STAGES = 3


def build_stage(stage: int, stages: int) -> paddle.nn.Layer:
    return models.build_stage(stage, stages)
