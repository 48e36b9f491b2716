"""The compatibility matrix: ppdsl's interpreter against the unpipelined model, cell by cell.

    python benchmarks/compat_matrix.py [--framework torch|paddle] [--device cpu|cuda]

A cell is a schedule and a setting users combine with pipelines. The schedule is the named
generator's program for one rank (`1f1b` and `zb1p` hold one stage there; `zbv`,
`interleaved_1f1b` and `dualpipev` two, so the stage-to-stage hand-over, the V placement and
overlapped pairs all run), 4 microbatches; the model is built from the classes below, which
stand for a user's own (`nn.Module` / `paddle.nn.Layer` subclasses, a LayerNorm, an MLP, a head
on the last stage, and in one setting an `autograd.Function` of the user's with a weight). Each cell builds the stages once, copies them for the reference, runs one
`PipelineSchedule.step` on one copy and the same microbatches through the other unpipelined
(forward, loss / microbatches, backward, in microbatch order), and compares every parameter's
gradient and each microbatch loss: float64 to 1e-9 relative, half precision (bf16 or fp16
autocast, bf16 parameters) to 1e-2. It also checks that nothing of ppdsl is left on the modules after the step and after
`close()`: they pickle, their state_dict keys and classes are unchanged, no instance forward.

The tests run every CPU cell (`tests/runtime/test_compat_matrix.py`); `gpu_check.py` runs the
torch cells on a GPU. Printed: one line per cell, its worst relative difference and verdict.
"""

from __future__ import annotations

import argparse
import copy
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "benchmarks"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

SCHEDULES = ("1f1b", "zb1p", "zbv", "interleaved_1f1b", "dualpipev")
TORCH_SETTINGS = ("own_class", "checkpoint", "checkpoint_reentrant", "checkpoint_sequential", "autocast_bf16",
                  "autocast_fp16", "bf16_params", "tied_on_one_rank", "embedding_conv1d", "own_function")
PADDLE_SETTINGS = ("own_class", "recompute", "recompute_reentrant", "tied_on_one_rank", "embedding_conv1d")
LOW_PRECISION = ("autocast_bf16", "autocast_fp16", "bf16_params")
AUTOCAST = {"autocast_bf16": "bfloat16", "autocast_fp16": "float16"}
M, ROWS, SEQ, WIDTH, VOCAB = 4, 2, 3, 8, 11  # WIDTH, VOCAB: as compat_torch_models


def tolerance(setting: str) -> float:
    return 1e-2 if setting in LOW_PRECISION else 1e-9


def program(schedule: str) -> Any:
    from ppdsl.expansion import parse

    return parse(f"pipeline ranks=1 microbatches={M}\nuse {schedule}()\n", f"<{schedule}>")


# --- PyTorch: a user's own model ---------------------------------------------------------------
def torch_stages(setting: str, stages: int, device: str) -> list[Any]:
    import torch
    from compat_torch_models import Block, TokenConv

    torch.manual_seed(0)
    if setting == "embedding_conv1d":
        built: list[Any] = [TokenConv(s == 0) for s in range(stages)]
    else:
        built = [Block(s == stages - 1, setting) for s in range(stages)]
    if setting == "tied_on_one_rank":  # GPT-2's tie: the last stage's head is the first stage's input weight
        built[-1].head.weight = built[0].inp.weight
    return [b.to(device=device, dtype=_torch_dtype(setting)) for b in built]


def _torch_dtype(setting: str) -> Any:
    import torch

    return torch.bfloat16 if setting == "bf16_params" else torch.float32 if setting in AUTOCAST else torch.float64


def torch_data(setting: str, device: str) -> tuple[Any, Any]:
    import torch

    g = torch.Generator().manual_seed(1)
    dtype = _torch_dtype(setting)
    if setting == "embedding_conv1d":
        x = torch.randint(0, VOCAB, (M * ROWS, SEQ), generator=g)
    else:
        x = torch.randn(M * ROWS, SEQ, WIDTH, generator=g).to(dtype)
    t = torch.randn(M * ROWS, SEQ, WIDTH, generator=g).to(dtype)
    return x.to(device), t.to(device)


def _torch_context(setting: str, device: str) -> Any:
    import contextlib

    import torch

    return torch.autocast(device, dtype=getattr(torch, AUTOCAST[setting])) if setting in AUTOCAST \
        else contextlib.nullcontext()


def _torch_loss(y: Any, t: Any) -> Any:
    return ((y.float() - t.float()) ** 2).mean()


# --- Paddle: the same model ---------------------------------------------------------------------
def paddle_stages(setting: str, stages: int) -> list[Any]:
    import paddle
    from paddle.distributed.fleet.utils import recompute

    paddle.set_default_dtype("float64")

    class Block(paddle.nn.Layer):  # type: ignore[misc]  # paddle is untyped
        def __init__(self, last: bool) -> None:
            super().__init__()
            self.inp = paddle.nn.Linear(WIDTH, WIDTH)
            self.mlp = paddle.nn.Sequential(paddle.nn.LayerNorm(WIDTH), paddle.nn.Linear(WIDTH, 2 * WIDTH),
                                            paddle.nn.GELU(), paddle.nn.Linear(2 * WIDTH, WIDTH))
            self.head = paddle.nn.Linear(WIDTH, WIDTH, bias_attr=False) if last else None

        def forward(self, x: Any) -> Any:
            h = self.inp(x)
            if setting == "recompute":
                h = h + recompute(self.mlp, h, use_reentrant=False)
            elif setting == "recompute_reentrant":
                h = h + recompute(self.mlp, h, use_reentrant=True)
            else:
                h = h + self.mlp(h)
            return self.head(h) if self.head is not None else h

    class TokenConv(paddle.nn.Layer):  # type: ignore[misc]
        def __init__(self, first: bool) -> None:
            super().__init__()
            self.embed = paddle.nn.Embedding(VOCAB, WIDTH) if first else None
            self.conv = paddle.nn.Conv1D(WIDTH, WIDTH, 3, padding=1, data_format="NLC")
            self.out = paddle.nn.Linear(WIDTH, WIDTH)

        def forward(self, x: Any) -> Any:
            h = self.embed(x) if self.embed is not None else x
            return self.out(paddle.tanh(self.conv(h)))

    paddle.seed(0)
    built: list[Any] = [TokenConv(s == 0) for s in range(stages)] if setting == "embedding_conv1d" else \
        [Block(s == stages - 1) for s in range(stages)]
    if setting == "tied_on_one_rank":
        built[-1].head.weight = built[0].inp.weight
    return built


def paddle_data(setting: str) -> tuple[Any, Any]:
    import numpy as np
    import paddle

    rng = np.random.default_rng(1)
    if setting == "embedding_conv1d":
        x = paddle.to_tensor(rng.integers(0, VOCAB, (M * ROWS, SEQ)))
    else:
        x = paddle.to_tensor(rng.standard_normal((M * ROWS, SEQ, WIDTH)))
    return x, paddle.to_tensor(rng.standard_normal((M * ROWS, SEQ, WIDTH)))


def _paddle_loss(y: Any, t: Any) -> Any:
    return ((y - t) ** 2).mean()


# --- one cell -------------------------------------------------------------------------------------
def run_cell(framework: str, schedule: str, setting: str, device: str = "cpu",
             split_backward: bool = True) -> dict[str, Any]:
    """One step of `schedule` under `setting` against the unpipelined model; the verdict."""
    from ppdsl.runtime import PipelineSchedule

    prog = program(schedule)
    if framework == "torch":
        import torch

        stages = torch_stages(setting, prog.stages, device)
        x, t = torch_data(setting, device)
        loss_fn: Callable[[Any, Any], Any] = _torch_loss
        context = _torch_context(setting, device)
        chunk: Callable[[Any], list[Any]] = lambda v: list(v.chunk(M))  # noqa: E731
        grad: Callable[[Any], Any] = lambda p: None if p.grad is None else p.grad.double().cpu()  # noqa: E731
        clear: Callable[[Any], None] = lambda s: s.zero_grad(set_to_none=True)  # noqa: E731
    else:
        import paddle

        stages = paddle_stages(setting, prog.stages)
        x, t = paddle_data(setting)
        loss_fn = _paddle_loss
        import contextlib

        context = contextlib.nullcontext()
        chunk = lambda v: list(paddle.chunk(v, M))  # noqa: E731
        grad = lambda p: None if p.grad is None else p.grad.numpy()  # noqa: E731
        clear = lambda s: s.clear_gradients(set_to_zero=False)  # noqa: E731
        torch = None
    reference = copy.deepcopy(stages)  # one deepcopy of the list: tied parameters stay tied
    classes = [type(m) for s in stages for m in _modules(framework, s)]
    keys = [list(s.state_dict()) for s in stages]
    want_losses = []
    with context:
        for xm, tm in zip(chunk(x), chunk(t)):
            h = xm
            for s in reference:
                h = s(h)
            loss = loss_fn(h, tm)
            want_losses.append(float(loss.detach()))
            (loss / M).backward()
    sched = PipelineSchedule(prog, stages, loss_fn, rank=0, framework=framework, split_backward=split_backward)
    losses: list[Any] = []
    with context:
        sched.step(x, target=t, losses=losses)
    worst = 0.0
    missing = []
    for s_ref, s_got in zip(reference, stages):
        for (name, p_ref), (_, p_got) in zip(s_ref.named_parameters(), s_got.named_parameters()):
            want, got = grad(p_ref), grad(p_got)
            if want is None and got is None:
                continue
            if want is None or got is None:
                missing.append(name)
                continue
            worst = max(worst, _relative(want, got))
    loss_diff = max(abs(float(a) - b) / max(abs(b), 1e-30) for a, b in zip(losses, want_losses))
    left = _left_on_modules(framework, stages, classes, keys)
    sched.close()
    left += _left_on_modules(framework, stages, classes, keys)
    for s in stages + reference:
        clear(s)
    ok = not missing and not left and worst <= tolerance(setting) and loss_diff <= tolerance(setting)
    return {"framework": framework, "schedule": schedule, "setting": setting, "device": device, "worst": worst,
            "loss": loss_diff, "missing": missing, "left": left, "ok": ok, "paths": getattr(sched, "split_paths", {})}


def _relative(want: Any, got: Any) -> float:
    import numpy as np

    w = np.asarray(want, dtype=np.float64)
    g = np.asarray(got, dtype=np.float64)
    return float(np.max(np.abs(w - g)) / max(float(np.max(np.abs(w))), 1e-30))


def _modules(framework: str, stage: Any) -> list[Any]:
    return list(stage.modules()) if framework == "torch" else list(stage.sublayers(include_self=True))


def _left_on_modules(framework: str, stages: list[Any], classes: list[type], keys: list[list[str]]) -> list[str]:
    """What of ppdsl stays on the user's modules (nothing should)."""
    left = []
    modules = [m for s in stages for m in _modules(framework, s)]
    if [type(m) for m in modules] != classes:
        left.append("a module's class changed")
    if any("forward" in vars(m) for m in modules):
        left.append("an instance forward")
    if [list(s.state_dict()) for s in stages] != keys:
        left.append("state_dict keys changed")
    if framework == "torch":
        try:
            pickle.dumps(stages)
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            left.append(f"pickle fails: {exc}")
    return left


def cells(framework: str) -> list[tuple[str, str]]:
    settings = TORCH_SETTINGS if framework == "torch" else PADDLE_SETTINGS
    return [(schedule, setting) for setting in settings for schedule in SCHEDULES]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--framework", choices=("torch", "paddle"), default="torch")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    bad = 0
    for schedule, setting in cells(args.framework):
        r = run_cell(args.framework, schedule, setting, args.device)
        bad += not r["ok"]
        print(f"{schedule:17s} {setting:22s} grads {r['worst']:.1e} loss {r['loss']:.1e} "
              f"{'ok' if r['ok'] else 'FAIL ' + '; '.join(r['missing'] + r['left'])}", flush=True)
    print(f"{len(cells(args.framework)) - bad} of {len(cells(args.framework))} cells exact")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
