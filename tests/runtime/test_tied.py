"""Tied parameters across stages (`ppdsl_tied`): the pipeline holds one copy per stage, the
reference model one shared parameter, and every copy's gradient must be the shared one's.
Ranks as threads of one process (loopback): real tensors, real autograd, every wait bounded.
The real processes on gloo run the tied GPT examples (`test_tied_gpt_examples_verify`)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from collections.abc import Callable
from typing import Any

import pytest

from ppdsl.cli import main
from ppdsl.expansion import parse
from ppdsl.runtime.errors import SetupError
from ppdsl.runtime.interpreter.handlers import ActionContext, register_handler
from ppdsl.runtime.interpreter.schedule import PipelineSchedule
from ppdsl.shard_actions import add_reduce_actions
from ppdsl.runtime.transport.loopback import Loopback

torch = pytest.importorskip("torch")

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE / "helpers"))
from procs import generator_files  # noqa: E402

WIDTH, M = 6, 4


class End(torch.nn.Module):
    """A stage: a Linear and a tanh; the first stage also maps its input in, the last maps its
    output back out with a matrix of the same shape, tied to the first one's."""

    def __init__(self, first: bool, last: bool) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(WIDTH, WIDTH)
        self.inp = torch.nn.Linear(WIDTH, WIDTH, bias=False) if first else None
        self.out = torch.nn.Linear(WIDTH, WIDTH, bias=False) if last else None
        ties = {}
        if first:
            ties["inp.weight"] = "io"
        if last:
            ties["out.weight"] = "io"
        self.ppdsl_tied = ties

    def forward(self, x: Any) -> Any:
        if self.inp is not None:
            x = self.inp(x)
        x = torch.tanh(self.fc(x))
        return self.out(x) if self.out is not None else x


def stages(n: int) -> list[End]:
    torch.manual_seed(0)
    return [End(s == 0, s == n - 1).double() for s in range(n)]


def loss_fn(y: Any, t: Any) -> Any:
    return ((y - t) ** 2).mean()


def run(gen: str, steps: int = 2, replicas: int = 1, reduce_grad: bool = False,
        on_rank: Callable[[PipelineSchedule], None] | None = None) -> tuple[list[list[End]], list[End]]:
    """`steps` SGD steps of the pipeline (ranks as threads; `replicas` of it, each on a batch of
    its own) and of the reference, a copy of the same stages whose last `out` IS the first
    stage's `inp` (one parameter), over every replica's batch. `reduce_grad`: the file places
    each stage's REDUCE_GRAD (`expand --reduce-grad`); `on_rank` sees each rank's schedule once
    it is built."""
    prog = parse(f"pipeline ranks=2 microbatches={M}\nuse {gen}\n", "<tied>")
    if reduce_grad:
        prog = add_reduce_actions(prog)
    copies = [stages(prog.stages) for _ in range(replicas)]
    reference = stages(prog.stages)
    reference[-1].out.weight = reference[0].inp.weight  # the tied model itself
    g = torch.Generator().manual_seed(1)
    batches = [[(torch.randn(2 * M, WIDTH, generator=g, dtype=torch.float64),
                 torch.randn(2 * M, WIDTH, generator=g, dtype=torch.float64)) for _ in range(replicas)]
               for _ in range(steps)]
    loop = Loopback("torch", prog.ranks, replicas, timeout=10.0)

    def rank_main(rank: int) -> None:
        replica = rank // prog.ranks
        mine = {s: copies[replica][s] for s in prog.stages_of(rank % prog.ranks)}
        sched = PipelineSchedule(prog, mine, loss_fn, transport=loop.links(rank))
        if on_rank is not None:
            on_rank(sched)
        optimizer = torch.optim.SGD([p for layer in mine.values() for p in layer.parameters()], lr=0.1)
        try:
            for i, batch in enumerate(batches):
                x, t = batch[replica]
                optimizer.zero_grad()
                sched.step(x, target=t)
                if i < steps - 1:  # the last step's gradients are compared
                    optimizer.step()
        finally:
            sched.close()

    loop.run(rank_main)
    params = list({id(p): p for layer in reference for p in layer.parameters()}.values())
    optimizer = torch.optim.SGD(params, lr=0.1)
    for i, batch in enumerate(batches):
        optimizer.zero_grad()
        for x, t in batch:
            for xm, tm in zip(x.chunk(M), t.chunk(M)):
                y = xm
                for layer in reference:
                    y = layer(y)
                (loss_fn(y, tm) / (M * replicas)).backward()
        if i < steps - 1:
            optimizer.step()
    return copies, reference


def assert_tied_like(layers: list[End], reference: list[End]) -> None:
    shared = reference[0].inp.weight
    # The copies started from the first stage's value and moved alike: still the shared one.
    torch.testing.assert_close(layers[-1].out.weight, shared, rtol=0, atol=1e-15)
    torch.testing.assert_close(layers[0].inp.weight, shared, rtol=0, atol=1e-15)
    for copy in (layers[0].inp.weight, layers[-1].out.weight):
        torch.testing.assert_close(copy.grad, shared.grad, rtol=1e-12, atol=1e-14)
    for ours, theirs in zip(layers, reference):
        torch.testing.assert_close(ours.fc.weight.grad, theirs.fc.weight.grad, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("gen", ["1f1b()", "zb1p()", "zbv()"])
def test_loopback_tied_copies_get_the_shared_parameters_gradient(gen: str) -> None:
    (layers,), reference = run(gen)
    assert_tied_like(layers, reference)


@pytest.mark.parametrize("gen", ["1f1b()", "zbv()"])
def test_loopback_tied_copies_over_two_replicas_get_the_global_batchs_gradient(gen: str) -> None:
    copies, reference = run(gen, replicas=2)
    for layers in copies:
        assert_tied_like(layers, reference)


@pytest.mark.parametrize("gen", ["1f1b()", "zb1p()", "zbv()"])
def test_loopback_a_tie_is_summed_from_the_stages_reduce_grad(gen: str) -> None:
    """With REDUCE_GRAD in the file, a rank's tie starts summing at the REDUCE_GRAD of its last
    stage holding a copy (seen by a handler wrapping it), and is exact."""
    started: list[tuple[str, int]] = []

    def reduce_grad(ctx: ActionContext) -> None:
        tied = ctx.schedule.tied
        assert tied is not None
        before = tied.posted
        ctx.default()
        started.append((ctx.label, tied.posted - before))

    registration = register_handler("REDUCE_GRAD", reduce_grad)
    try:
        (layers,), reference = run(gen, reduce_grad=True)
    finally:
        registration.remove()
    assert_tied_like(layers, reference)
    # Per step (two): on 1F1B and zb1p each rank starts the tie at its stage's REDUCE_GRAD; on
    # ZB-V rank 0 holds both ends and starts it at the later of their two, stage 0's.
    expected = ["0REDUCE_GRAD", "1REDUCE_GRAD"] if gen != "zbv()" else ["0REDUCE_GRAD"]
    assert sorted(label for label, n in started if n) == sorted(2 * expected), started
    assert all(n in (0, 1) for _, n in started), started


@pytest.mark.parametrize("first, last, message", [
    ({"inp.weight": "io"}, {}, "tie 'io' is declared by stage 0's inp.weight alone"),
    ({"inp.weight": "io", "nope.weight": "x"}, {}, "stage 0: `ppdsl_tied` names 'nope.weight', which is not one of"),
    (["inp.weight"], {}, "stage 0: `ppdsl_tied` must be a dict of parameter name -> tie name"),
    ({"inp.weight": "io"}, {"fc.bias": "io"},
     "tie 'io': stage 0's inp.weight is float64 [6, 6] but stage 1's fc.bias is float64 [6]"),
])
def test_loopback_a_bad_tie_is_refused_on_every_rank_before_any_step(first: Any, last: Any, message: str) -> None:
    prog = parse(f"pipeline ranks=2 microbatches={M}\nuse 1f1b()\n", "<tied>")
    layers = stages(prog.stages)
    layers[0].ppdsl_tied, layers[-1].ppdsl_tied = first, last
    loop = Loopback("torch", prog.ranks, timeout=10.0)

    def rank_main(rank: int) -> str:
        try:
            PipelineSchedule(prog, {s: layers[s] for s in prog.stages_of(rank)}, loss_fn, transport=loop.links(rank))
        except SetupError as exc:
            return str(exc)
        return "built"

    said = loop.run(rank_main)
    assert all(message in s for s in said), said


@pytest.mark.slow
@pytest.mark.parametrize("framework, model, calls", [
    ("torch", "examples/torch/gpt/model.py:build_tied_stage", ("1f1b()", "zb1p()", "zbv()")),
    ("paddle", "examples/gpt/model.py:build_tied_stage", ("1f1b()", "zb1p()", "zbv()")),
])
def test_tied_gpt_examples_verify(framework: str, model: str, calls: tuple[str, ...],
                                  capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip(framework)
    files = generator_files(tmp_path, calls)
    # Clipped too: a tie counts once in the global norm, as the one parameter of the model.
    code = main(["run", *files, "--model", str(ROOT / model), "--verify", "--steps", "2", "--rtol", "1e-5",
                 "--timeout", "60", "--clip-grad-norm", "1.0"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    for f in files:
        assert re.search(rf"{re.escape(f)}: 2 steps, .*verify ok", out), out


@pytest.mark.slow
def test_tied_gpt_summed_at_reduce_grad_over_two_replicas_verifies(capsys: pytest.CaptureFixture[str],
                                                                    tmp_path: Path) -> None:
    """Files whose REDUCE_GRADs `expand --reduce-grad` placed, 2 ranks x 2 replicas on gloo (four
    processes): each tie is summed over the copies of both replicas, started at them."""
    files = []
    for f in generator_files(tmp_path, ("1f1b()", "zbv()")):
        placed = f.replace(".pps", "_reduce.pps")
        assert main(["expand", "--reduce-grad", f, "-o", placed]) == 0
        assert "REDUCE_GRAD" in Path(placed).read_text()
        files.append(placed)
    code = main(["run", *files, "--model", str(ROOT / "examples/torch/gpt/model.py:build_tied_stage"), "--verify",
                 "--steps", "2", "--rtol", "1e-5", "--timeout", "60", "--dp", "2"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    for f in files:
        assert re.search(rf"{re.escape(f)}: 2 steps, .*verify ok", out), out


@pytest.mark.slow
def test_the_documented_reduce_grad_example_runs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    doc = (ROOT / "docs" / "runtime.md").read_text()
    shown = ("ppdsl expand --reduce-grad schedules/zbv.pps -o zbv_reduce.pps\n"
             "ppdsl run zbv_reduce.pps --model examples/torch/gpt/model.py:build_tied_stage --verify\n")
    assert shown in doc
    placed = str(tmp_path / "zbv_reduce.pps")
    assert main(["expand", "--reduce-grad", str(ROOT / "schedules/zbv.pps"), "-o", placed]) == 0
    code = main(["run", placed, "--model", str(ROOT / "examples/torch/gpt/model.py:build_tied_stage"), "--verify",
                 "--steps", "2", "--timeout", "60"])
    out, err = capsys.readouterr()
    assert code == 0 and "verify ok" in out, out + err
