"""The split backward in one process: same gradients, deferred exactly under their key, nothing kept."""

from __future__ import annotations

from typing import Any

import pytest

paddle = pytest.importorskip("paddle")

import numpy as np  # noqa: E402  # after the skip: numpy comes with the paddle extra

from ppdsl.runtime.interpreter.split_backward import DeferredGrads, SplitLinears  # noqa: E402

WIDTH = 6


def _stage(seed: int) -> Any:
    paddle.seed(seed)
    return paddle.nn.Sequential(paddle.nn.Linear(WIDTH, WIDTH), paddle.nn.GELU(),
                                paddle.nn.Linear(WIDTH, WIDTH, bias_attr=False), paddle.nn.LayerNorm(WIDTH))


def _data(m: int) -> tuple[Any, Any]:
    rng = np.random.default_rng(m)
    return (paddle.to_tensor(rng.standard_normal((3, 2, WIDTH))),  # a leading batch of 2: matmul over 3-D
            paddle.to_tensor(rng.standard_normal((3, 2, WIDTH))))


def _backward(layer: Any, m: int) -> Any:
    x, dy = _data(m)
    x.stop_gradient = False
    paddle.autograd.backward([layer(x)], [dy])
    return x.grad


def _grads(layer: Any) -> dict[str, Any]:
    return {n: None if p.grad is None else p.grad.numpy() for n, p in layer.named_parameters()}


@pytest.fixture(autouse=True)
def float64() -> Any:
    saved = paddle.get_default_dtype()
    paddle.set_default_dtype("float64")
    yield
    paddle.set_default_dtype(saved)


def test_switching_keeps_parameters_and_state_dict() -> None:
    plain, split = _stage(1), _stage(1)
    params = [id(p) for p in split.parameters()]
    linears = SplitLinears({0: split}, DeferredGrads())
    assert [name for name, _ in linears.switched[0]] == ["0", "2"] and linears.kept[0] == {}
    with linears.active():
        assert "forward" in vars(split[0])
        assert [id(p) for p in split.parameters()] == params
        assert split.state_dict().keys() == plain.state_dict().keys()
        for k, v in plain.state_dict().items():
            assert np.array_equal(v.numpy(), split.state_dict()[k].numpy())
    assert "forward" not in vars(split[0]) and "forward" not in vars(split[2])


@pytest.mark.parametrize("gemm", [True, False], ids=["add inside the GEMM", "matmul then add_"])
def test_input_gradient_now_weight_gradients_at_their_own_key_in_any_order(monkeypatch: pytest.MonkeyPatch,
                                                                           gemm: bool) -> None:
    import ppdsl.runtime.paddle_backend.split as sb

    fused: list[bool] = []
    real = sb.accumulate_product if gemm else (lambda *a: False)
    monkeypatch.setattr(sb, "accumulate_product", lambda *a: fused.append(real(*a)) or fused[-1])
    plain, split = _stage(2), _stage(2)
    store = DeferredGrads()
    switched = SplitLinears({0: split}, store).active()
    switched.__enter__()  # left switched: the stage is dropped with the test
    want_dx = [_backward(plain, m).numpy() for m in range(3)]
    for m in range(3):  # I(0, m): input, bias and LayerNorm gradients now; Linear weights kept
        store.key = (0, m)
        assert np.array_equal(_backward(split, m).numpy(), want_dx[m])
        store.key = None
    assert split[0].weight.grad is None and split[2].weight.grad is None
    assert split[0].bias.grad is not None and split[3].weight.grad is not None
    assert sorted(store.keys()) == [(0, 0), (0, 1), (0, 2)]
    for m in (2, 0, 1):  # W(0, m) in another order than the I's
        assert store.run((0, m)) == 2  # two Linear layers each
        assert not store.holds((0, m))
    assert store.run((0, 0)) == 0  # nothing twice
    assert list(store.tensors()) == []
    got, want = _grads(split), _grads(plain)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=0)
    # The first W of each weight makes its gradient; the later ones add into it with one GEMM
    # where the math library allows (3-D inputs are taken as rows), else the autograd way.
    from ppdsl.runtime.paddle_backend.blas import _gemms

    assert fused == [gemm and _gemms() is not None] * 4


def test_without_a_key_the_weight_gradient_comes_at_once() -> None:
    plain, split = _stage(3), _stage(3)
    store = DeferredGrads()
    _backward(plain, 0)
    with SplitLinears({0: split}, store).active():
        _backward(split, 0)  # a fused B: store.key is None
    assert list(store.keys()) == []
    for name, want in _grads(plain).items():
        np.testing.assert_allclose(_grads(split)[name], want, rtol=1e-12, atol=0)


def test_a_linear_with_its_own_forward_is_left_alone() -> None:
    class Scaled(paddle.nn.Linear):  # type: ignore[misc]
        def forward(self, x: Any) -> Any:
            return super().forward(x) * 2.0

    stage = paddle.nn.Sequential(paddle.nn.Linear(WIDTH, WIDTH), Scaled(WIDTH, WIDTH))
    linears = SplitLinears({0: stage}, DeferredGrads())
    assert [name for name, _ in linears.switched[0]] == ["0"]
    assert linears.warnings() == ["stage 0: layer 1 (Scaled) overrides Linear.forward, so its weight gradient cannot be deferred "
                               "to W; it is computed with the input gradient in I"]


class _SeesTheCollector(paddle.nn.Layer):  # type: ignore[misc]  # paddle is untyped
    """A stage that records, at each forward, whether Python's cyclic collector may run."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = _stage(0)
        self.seen: list[bool] = []

    def forward(self, x: Any) -> Any:
        import gc

        self.seen.append(gc.isenabled())
        return self.inner(x)


@pytest.mark.parametrize("pause", [True, False])
def test_a_step_runs_with_the_cyclic_collector_paused_unless_asked_not_to(pause: bool) -> None:
    import gc

    from ppdsl.runtime.interpreter.schedule import PipelineSchedule
    from ppdsl.expansion import parse

    program = parse("pipeline ranks=1 microbatches=2\nrank 0: 0F0 0I0 0F1 0I1 0W1 0W0\n")
    stage = _SeesTheCollector()
    sched = PipelineSchedule(program, [stage], lambda y, t: ((y - t) ** 2).mean(), rank=0, pause_gc=pause)
    assert gc.isenabled()
    x, t = (paddle.concat(pair) for pair in zip(_data(0), _data(1)))  # a batch of 6 rows: 2 microbatches
    sched.step(x, target=t)
    assert stage.seen == [not pause, not pause] and gc.isenabled()
    gc.disable()  # a user who runs without the collector keeps it off after a step
    try:
        sched.step(x, target=t)
        assert stage.seen[-2:] == [False, False] and not gc.isenabled()
    finally:
        gc.enable()


def test_a_profile_leaves_its_own_memory_counting_out_of_every_action(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a clock that only the memory count moves, every action (a pair too) measures 0."""
    import time

    from ppdsl.runtime.interpreter.live_memory import LiveMemory
    from ppdsl.runtime.interpreter.schedule import PipelineSchedule
    from ppdsl.expansion import parse

    now = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    real = LiveMemory._observe

    def slow(self: LiveMemory, sched: Any) -> None:
        now[0] += 1000.0
        real(self, sched)

    monkeypatch.setattr(LiveMemory, "_observe", slow)
    program = parse("pipeline ranks=1 microbatches=2\nrank 0: 0F0 (0F1;0I0) 0W0 0I1 0W1\n")
    sched = PipelineSchedule(program, [_stage(4)], lambda y, t: ((y - t) ** 2).mean(), rank=0, profile=True)
    x, t = (paddle.concat(pair) for pair in zip(_data(0), _data(1)))
    sched.step(x, target=t)
    assert sched.memory.seconds == 7 * 1000.0  # after each of the 5 actions and each part of the pair
    assert len(sched.timings) == 5 and all(d == [0.0] for d in sched.timings.values())
    assert sched.memory.peak_graphs == 2


def test_a_large_embedding_defers_its_table_gradient_to_W(monkeypatch: pytest.MonkeyPatch) -> None:
    """Paddle: an Embedding at least `EMBEDDING_MIN` large computes through the split layer, its
    table's gradient (duplicate ids added, the padding id's rows left out) waits for W, and the
    step's gradients are autograd's; a smaller one, or one with `max_norm`, stays as it is."""
    import copy

    from ppdsl.expansion import parse
    from ppdsl.kinds import Kind
    from ppdsl.runtime import PipelineSchedule
    from ppdsl.runtime.interpreter import split_backward

    monkeypatch.setattr(split_backward, "EMBEDDING_MIN", 40)
    paddle.seed(5)

    class Tokens(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.embed = paddle.nn.Embedding(50, WIDTH, padding_idx=3)
            self.small = paddle.nn.Embedding(5, WIDTH)
            self.normed = paddle.nn.Embedding(50, WIDTH, max_norm=1.0)
            self.out = paddle.nn.Linear(WIDTH, WIDTH)

        def forward(self, ids: Any) -> Any:
            return self.out(self.embed(ids) + self.small(ids % 5))

    stage = Tokens()
    reference = copy.deepcopy(stage)
    seen: list[bool] = []

    def spy(ctx: Any) -> None:
        before = stage.embed.weight.grad
        before = None if before is None else before.numpy().copy()
        ctx.default()
        after = stage.embed.weight.grad.numpy()
        seen.append(before is None or not np.array_equal(before, after))

    prog = parse("pipeline ranks=1 microbatches=2\nuse zb1p()\n", "<test>")
    loss = lambda y, t: ((y - t) ** 2).mean()  # noqa: E731
    sched = PipelineSchedule(prog, [stage], loss, rank=0, framework="paddle", handlers={Kind.W: spy})
    assert sched.split_paths[0] == "split: the weight gradients of 1 Linear and 1 Embedding deferred to W"
    ids = paddle.to_tensor(np.array([[3, 1, 7, 7], [49, 3, 0, 7], [2, 2, 2, 3], [11, 12, 3, 3]]))
    target = paddle.to_tensor(np.random.default_rng(0).standard_normal((4, 4, WIDTH)))
    sched.step(ids, target=target)
    assert seen == [True, True]
    for part, want in ((ids[:2], target[:2]), (ids[2:], target[2:])):
        (loss(reference(part), want) / 2).backward()
    for (name, want), got in zip(reference.named_parameters(), stage.parameters()):
        if want.grad is None:
            assert got.grad is None, name
            continue
        assert np.allclose(want.grad.numpy(), got.grad.numpy(), rtol=1e-12, atol=1e-14), name
    assert np.all(stage.embed.weight.grad.numpy()[3] == 0)  # the padding id's row
    sched.close()


@pytest.mark.slow
def test_a_large_embedding_verifies_across_processes(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """`ppdsl run --verify` on Paddle, 2 ranks on gloo: a 2**20-element table deferred, exact."""
    from pathlib import Path

    from ppdsl.cli import main
    from procs import generator_files

    files = generator_files(tmp_path, ["zb1p()", "zbv()"], suffix="_2")
    model = str(Path(__file__).parent / "helpers" / "paddle_tokens_model.py")
    code = main(["run", *files, "--framework", "paddle", "--model", f"{model}:build_stage", "--data",
                 f"{model}:batches", "--loss", f"{model}:loss", "--steps", "2", "--verify", "--verbose",
                 "--timeout", "60"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert out.count("verify ok: ") == 2, out
    assert "weight gradients of 1 Linear and 1 Embedding deferred to W" in out + err


@pytest.mark.parametrize("rows", ["0F0 1F0 0F1 1F1 1R0 1B0 0R0 0B0 1R1 1B1 0R1 0B1",
                                  "0F0 1F0 0F1 1F1 1R0 1I0 0R0 0I0 1R1 1I1 0R1 0I1 1W0 0W0 1W1 0W1",
                                  "0F0 0OFFLOAD0 1F0 1OFFLOAD0 0F1 1F1 1RELOAD0 1B0 0RELOAD0 0B0 1B1 0B1",
                                  "0F0 0OFFLOAD0 1F0 0F1 1F1 1R0 1I0 0RELOAD0 0I0 1R1 1I1 0I1 1W0 0W0 1W1 0W1"])
def test_recompute_and_offload_on_paddle_give_autograds_gradients(rows: str) -> None:
    """R on Paddle (with B, and with the split I/W): the forward again from its kept input, the
    dropout mask its F drew, the generator left where a run without R leaves it; OFFLOAD and
    RELOAD: what the forward saved, to host memory and back."""
    import copy

    from ppdsl.expansion import parse
    from ppdsl.runtime import PipelineSchedule

    paddle.seed(3)
    layers = [paddle.nn.Sequential(_stage(s), paddle.nn.Dropout(0.3)) for s in range(2)]
    reference = copy.deepcopy(layers)
    prog = parse(f"pipeline ranks=1 microbatches=2 stages=2 placement=loop\nrank 0: {rows}\n", "<test>")
    loss = lambda y, t: ((y - t) ** 2).mean()  # noqa: E731
    sched = PipelineSchedule(prog, layers, loss, rank=0, framework="paddle")
    rng = np.random.default_rng(4)
    x, t = (paddle.to_tensor(rng.standard_normal((4, 2, WIDTH))) for _ in range(2))
    paddle.seed(11)
    sched.step(x, target=t)
    after = paddle.rand([1]).numpy()
    paddle.seed(11)
    for xm, tm in zip(paddle.chunk(x, 2), paddle.chunk(t, 2)):
        (loss(reference[1](reference[0](xm)), tm) / 2).backward()
    assert np.array_equal(after, paddle.rand([1]).numpy())
    for layer, ref in zip(layers, reference):
        for (name, p), q in zip(layer.named_parameters(), ref.parameters()):
            assert np.allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-10, atol=1e-12), name
    sched.close()
