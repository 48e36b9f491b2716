"""The split on the autograd graph (PyTorch): weights outside a Linear deferred to `W`, exactly.

Each case runs a stage's backward split in two (`I` then `W`) and compares every gradient with
one plain autograd backward of a copy, in float64; the deferred weights must have no gradient
between the two. Cases the split cannot do exactly must be refused before any work."""

from __future__ import annotations

import copy
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from ppdsl.expansion import parse  # noqa: E402
from ppdsl.runtime import PipelineSchedule  # noqa: E402
from ppdsl.runtime.framework import SplitCostly, SplitRefused  # noqa: E402
from ppdsl.runtime.torch_backend import graph_split  # noqa: E402
from ppdsl.runtime.interpreter import split_backward  # noqa: E402
from ppdsl.runtime.torch_backend.split import graph_weights  # noqa: E402

WIDTH = 8


@pytest.fixture(autouse=True)
def small_embeddings_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests' tables are small; the split is the same whatever their size."""
    monkeypatch.setattr(split_backward, "EMBEDDING_MIN", 0)


class Scale(torch.autograd.Function):  # a user's own Function with a weight matrix
    @staticmethod
    def forward(ctx: Any, x: Any, w: Any) -> Any:
        ctx.save_for_backward(x, w)
        return x @ w

    @staticmethod
    def backward(ctx: Any, g: Any) -> Any:
        x, w = ctx.saved_tensors
        return g @ w.t(), x.reshape(-1, x.shape[-1]).t() @ g.reshape(-1, g.shape[-1])


class Mixer(torch.nn.Module):
    """Token and position embeddings summed (a branch only W needs), a LayerNorm, a Conv1d and
    a Function with a weight (forks), a residual, and a Linear that overrides its forward."""

    def __init__(self, first: bool, checkpointed: bool = False):
        super().__init__()
        self.first, self.checkpointed = first, checkpointed
        if first:
            self.tok = torch.nn.Embedding(11, WIDTH)
            self.pos = torch.nn.Embedding(4, WIDTH)
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.conv = torch.nn.Conv1d(4, 4, 3, padding=1)
        self.mix = torch.nn.Parameter(torch.randn(WIDTH, WIDTH) / WIDTH)
        self.out = Doubled(WIDTH, WIDTH)

    def body(self, h: Any) -> Any:
        z = self.conv(self.norm(h))
        z = torch.nn.functional.gelu(Scale.apply(z, self.mix))
        return h + self.out(z)

    def forward(self, x: Any) -> Any:
        h = self.tok(x) + self.pos(torch.arange(4)) if self.first else x
        if self.checkpointed:
            return torch.utils.checkpoint.checkpoint(self.body, h, use_reentrant=False)
        return self.body(h)


class Doubled(torch.nn.Linear):
    def forward(self, x: Any) -> Any:  # overrides Linear.forward: no split Linear for it
        return torch.nn.functional.linear(x, self.weight, self.bias) * 2


def _run_split(stage: Any, x: Any, dy: Any) -> tuple[Any, list[bool], list[str], list[str], int]:
    """`I` then `W` as a stage runs them: weights whose fork would cost twice go to `I` first."""
    deferred = [p for _, p, _ in graph_weights(stage, [])]
    eager = [p for p in stage.parameters() if all(p is not q for q in deferred)]
    leaf = x.detach().requires_grad_(x.is_floating_point())
    y = stage(leaf)
    inputs = [leaf] if leaf.requires_grad else []
    moved: list[str] = []
    while True:
        try:
            got, rest = graph_split.backward_input([y], [dy], inputs, eager, deferred)
            break
        except SplitCostly as costly:
            assert all(p.grad is None for p in stage.parameters())  # refused before any work
            moved += costly.nodes
            eager += costly.weights
            deferred = [p for p in deferred if all(p is not w for w in costly.weights)]
    untouched = [p.grad is None for p in deferred]
    reached = rest() if rest is not None else 0
    names = {id(p): n for n, p in stage.named_parameters()}
    return (got[0] if got else None), untouched, [names[id(p)] for p in deferred], moved, reached


@pytest.mark.parametrize("first", [True, False])
@pytest.mark.parametrize("checkpointed", [False, True])
def test_split_on_the_graph_gives_autograds_gradients(first: bool, checkpointed: bool) -> None:
    torch.manual_seed(0)
    with torch.random.fork_rng():
        torch.set_default_dtype(torch.float64)
        try:
            stage = Mixer(first, checkpointed)
            plain = copy.deepcopy(stage)
            x = torch.randint(0, 11, (3, 4)) if first else torch.randn(3, 4, WIDTH)
            dy = torch.randn(3, 4, WIDTH)
            want_x = x.detach().requires_grad_(not first)
            plain(want_x).backward(dy)
            got_x, untouched, deferred, moved, reached = _run_split(stage, x, dy)
        finally:
            torch.set_default_dtype(torch.float32)
    # The convolution's and the Function's backward make both gradients in one call: kept in I.
    assert moved == ["ConvolutionBackward0", "ScaleBackward"]
    assert sorted(deferred) == sorted((["tok.weight", "pos.weight"] if first else []) + ["out.weight"])
    assert all(untouched), "a deferred weight had its gradient before W"
    assert reached == len(deferred)
    if not first:
        assert torch.equal(got_x, want_x.grad)
    for (name, p), q in zip(plain.named_parameters(), stage.parameters()):
        assert q.grad is not None, name
        assert torch.allclose(p.grad, q.grad, rtol=1e-12, atol=1e-14), name


def test_a_weight_used_twice_along_a_path_is_refused_before_any_work() -> None:
    w = torch.nn.Parameter(torch.randn(3, 3))
    x = torch.randn(2, 3, requires_grad=True)
    y = (x @ w) @ w
    with pytest.raises(SplitRefused, match="used twice along a path"):
        graph_split.backward_input([y], [torch.ones_like(y)], [x], [], [w])
    assert x.grad is None and w.grad is None


def test_a_tensor_of_no_stage_is_refused() -> None:
    outside = torch.randn(4, 4, requires_grad=True)
    emb = torch.nn.Embedding(3, 4)
    y = emb(torch.tensor([0, 2])) @ outside
    with pytest.raises(SplitRefused, match="neither the stage's input nor one of its parameters"):
        graph_split.backward_input([y], [torch.ones_like(y)], [], [], [emb.weight])


def test_a_hooked_parameter_finished_in_I_is_refused() -> None:
    norm = torch.nn.LayerNorm(4)
    norm.weight.register_hook(lambda g: g)
    y = norm(torch.randn(2, 4))
    with pytest.raises(SplitRefused, match="gradient hook"):
        graph_split.backward_input([y], [torch.ones_like(y)], [], [norm.weight, norm.bias], [])


class Hooked(torch.nn.Module):
    """A Conv1d whose output gradient a hook doubles: the fork would run the hook twice."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(4, 4, 3, padding=1)

    def forward(self, x: Any) -> Any:
        y = self.conv(x)
        y.register_hook(lambda g: g * 2)
        return y + x


def _schedule_step(stages: list[Any], text: str) -> tuple[PipelineSchedule, list[Any]]:
    prog = parse(text, "<test>")
    sched = PipelineSchedule(prog, stages, lambda y, t: ((y - t) ** 2).mean(), rank=0, framework="torch")
    x, t = torch.randn(4, 4, WIDTH, dtype=torch.float64), torch.randn(4, 4, WIDTH, dtype=torch.float64)
    sched.step(x, target=t)
    return sched, [x, t]


def _reference_grads(stages: list[Any], x: Any, t: Any, microbatches: int) -> list[Any]:
    for xm, tm in zip(x.chunk(microbatches), t.chunk(microbatches)):
        h = xm
        for s in stages:
            h = s(h)
        (((h - tm) ** 2).mean() / microbatches).backward()
    return [p.grad for s in stages for p in s.parameters()]


def test_a_forward_that_hooks_an_activation_turns_the_split_off_and_stays_exact() -> None:
    torch.manual_seed(1)
    stages = [Hooked().double() for _ in range(2)]
    reference = copy.deepcopy(stages)
    with pytest.warns(UserWarning, match="hook on an activation"):
        sched, (x, t) = _schedule_step(stages, "pipeline ranks=1 microbatches=2\nuse zbv()\n")
    want = _reference_grads(reference, x, t, 2)
    got = [p.grad for s in stages for p in s.parameters()]
    assert all(torch.allclose(a, b, rtol=1e-12) for a, b in zip(want, got))
    assert "computed in I" in sched.split_paths[0] and "hook on an activation" in sched.split_paths[0]
    sched.close()


def test_W_is_where_the_graphs_weights_get_their_gradients() -> None:
    """Through the interpreter: each W adds its microbatch's share to the Linear subclass's
    weight (deferred on the graph) and nothing to the convolution's (kept in I: its CPU backward
    makes both gradients in one call); the step's result is autograd's."""
    torch.manual_seed(2)
    stages = [torch.nn.Sequential(torch.nn.LayerNorm(WIDTH), Reshaped(torch.nn.Conv1d(4, 4, 3, padding=1)),
                                  Doubled(WIDTH, WIDTH)).double() for _ in range(2)]
    reference = copy.deepcopy(stages)
    seen: list[tuple[str, bool, bool]] = []
    from ppdsl.kinds import Kind

    def spy(ctx: Any) -> None:
        linear, conv = ctx.stage.layer[2].weight, ctx.stage.layer[1].conv.weight
        before = [None if w.grad is None else w.grad.clone() for w in (linear, conv)]
        ctx.default()
        seen.append((ctx.op.label, *(b is None and w.grad is not None or b is not None and not torch.equal(b, w.grad)
                                     for b, w in zip(before, (linear, conv)))))

    prog = parse("pipeline ranks=1 microbatches=2\nuse zbv()\n", "<test>")
    sched = PipelineSchedule(prog, stages, lambda y, t: ((y - t) ** 2).mean(), rank=0, framework="torch",
                             handlers={Kind.W: spy})
    x, t = torch.randn(4, 4, WIDTH, dtype=torch.float64), torch.randn(4, 4, WIDTH, dtype=torch.float64)
    sched.step(x, target=t)
    assert len(seen) == 4 and all(linear and not conv for _, linear, conv in seen), seen
    assert sched.split_paths[0] == (
        "split: the weight gradients of 2.weight (Doubled) deferred to W on the autograd graph; 1.conv.weight (Conv1d) "
        "computed in I: its backward (ConvolutionBackward0) makes the input and weight gradients together")
    want = _reference_grads(reference, x, t, 2)
    got = [p.grad for s in stages for p in s.parameters()]
    assert all(torch.allclose(a, b, rtol=1e-12) for a, b in zip(want, got))
    sched.close()


class Reshaped(torch.nn.Module):
    def __init__(self, conv: Any) -> None:
        super().__init__()
        self.conv = conv

    def forward(self, x: Any) -> Any:
        return self.conv(x)


def test_the_documented_path_of_a_stage_is_what_it_reports() -> None:
    from pathlib import Path

    torch.manual_seed(3)
    prog = parse("pipeline ranks=1 microbatches=2\nuse zb1p()\n", "<test>")
    sched = PipelineSchedule(prog, [Mixer(True).double()], lambda y, t: ((y - t) ** 2).mean(), rank=0,
                             framework="torch")
    sched.step(torch.randint(0, 11, (4, 4)), target=torch.randn(4, 4, WIDTH, dtype=torch.float64))
    doc = (Path(__file__).parents[2] / "docs" / "runtime.md").read_text()
    assert f"```text\nppdsl run: rank 0: stage 0: weight gradients: {sched.split_paths[0]}\n```" in doc
    sched.close()


def test_small_embedding_tables_stay_in_I_and_large_ones_are_deferred(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(split_backward, "EMBEDDING_MIN", 100)
    stage = torch.nn.ModuleDict({"small": torch.nn.Embedding(9, 11), "large": torch.nn.Embedding(10, 10),
                                 "conv": torch.nn.Conv1d(1, 1, 2)})
    assert sorted(n for n, _, _ in graph_weights(stage, [])) == ["conv.weight", "large.weight"]


@pytest.mark.slow
def test_own_layers_verify_across_processes(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """`ppdsl run --verify` at 2 ranks on gloo: each stage's Linear subclass deferred on the
    graph, its Conv1d kept in I, exact."""
    from pathlib import Path

    from ppdsl.cli import main
    from procs import generator_files

    files = generator_files(tmp_path, ["zb1p()", "zbv()"], suffix="_2")
    model = str(Path(__file__).parent / "helpers" / "own_layers_torch_model.py")
    code = main(["run", *files, "--framework", "torch", "--model", model, "--steps", "2", "--verify", "--verbose",
                 "--timeout", "60"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert out.count("verify ok: ") == 2, out
    said = out + err
    assert "scaled.weight (ScaledLinear) deferred to W on the autograd graph; conv.weight (Conv1d) computed in I" \
        in said, said


def test_the_benchmark_runs_its_sides_to_the_same_gradients() -> None:
    """`benchmarks/bench_graph_split.py` (its figures are the benchmark's, not this test's)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
    try:
        import bench_graph_split
    finally:
        sys.path.pop(0)
    r = bench_graph_split.measure(rounds=1, steps=1)
    assert r["diff"] <= 1e-4
    assert "embed.weight (Embedding)" in r["paths"][0] and "deferred to W on the autograd graph" in r["paths"][0]
