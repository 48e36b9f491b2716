"""`--data` for the built-in model (torch) whose second batch holds an infinity: that step's
loss and gradients are not finite on the ranks that see it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ppdsl.runtime.jobs.models import synthetic_batches


def batches() -> Iterator[tuple[Any, Any]]:
    for i, (x, y) in enumerate(synthetic_batches(4, seed=0, framework="torch")):
        if i == 1:
            x = x.clone()
            x[0, 0] = float(np.inf)
        yield x, y
        if i > 100:
            return
