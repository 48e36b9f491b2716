"""A model whose stages pass dicts of tensors, for the stage-value tests (float64, exact).

Stage 0 returns {"h", "ids", "aux"}: `h` and `aux` need gradients back, `ids` (int64) does
not. Every later stage takes them as keyword arguments; the middle ones return the same dict,
the last a [rows, 1] output. With PPDSL_VALUES_BAD=1 stage 0 also returns a string member,
which may pass to a stage on the same rank but not to another rank.
"""

from __future__ import annotations

import os

import paddle

WIDTH = 8
_DTYPE = "float64"


class Stage(paddle.nn.Layer):
    def __init__(self, stage: int, stages: int):
        super().__init__()
        self.first, self.last = stage == 0, stage == stages - 1
        self.lin = paddle.nn.Linear(WIDTH, 1 if self.last else WIDTH)
        if self.first:
            self.aux = paddle.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: paddle.Tensor | None = None, *, h: paddle.Tensor | None = None,
                ids: paddle.Tensor | None = None, aux: paddle.Tensor | None = None, note: str | None = None) -> object:
        if self.first:
            assert x is not None
            out: dict[str, object] = {"h": paddle.tanh(self.lin(x)), "ids": (x[:, 0] > 0).astype("int64"),
                                      "aux": self.aux(x)}
            if os.environ.get("PPDSL_VALUES_BAD"):
                out["note"] = "a string"
            return out
        assert h is not None and ids is not None and aux is not None
        gate = 1.0 + ids.unsqueeze(1).astype(h.dtype)  # ids steer the computation but need no gradient
        if self.last:
            return self.lin(h * gate + aux)
        return {"h": paddle.tanh(self.lin(h)) * gate, "ids": ids, "aux": aux * 0.5}


def build_stage(stage: int, stages: int) -> paddle.nn.Layer:
    saved = paddle.get_default_dtype()
    paddle.set_default_dtype(_DTYPE)
    try:
        return Stage(stage, stages)
    finally:
        paddle.set_default_dtype(saved)


def batches(rows: int = 16) -> object:
    import numpy as np

    rng = np.random.default_rng(3)
    while True:
        x = rng.standard_normal((rows, WIDTH))
        yield paddle.to_tensor(x), paddle.to_tensor(np.sin(x.sum(1, keepdims=True)))


def loss(out: paddle.Tensor, target: paddle.Tensor) -> paddle.Tensor:
    return paddle.nn.functional.mse_loss(out, target)
