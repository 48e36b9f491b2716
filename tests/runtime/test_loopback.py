"""The interpreter in one process: ranks as threads (`ppdsl.runtime.transport.loopback`), real tensors.

Every test here names `loopback`, so `pytest -m "not slow" -k loopback tests/runtime` runs them.
Each compares what the pipeline computed with the same model run whole (gradients to float
tolerance) or checks what a failure says; none starts a process."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from ppdsl.diagnostics import PpsError
from ppdsl.expansion import parse
from ppdsl.ir import Kind, Program
from ppdsl.runtime.errors import MessageOrderError, SetupError, StepError
from ppdsl.runtime.interpreter.handlers import ActionContext, register_handler
from ppdsl.runtime.transport.loopback import Loopback
from ppdsl.runtime.interpreter.preflight import lint
from ppdsl.runtime.interpreter.schedule import PipelineSchedule
from ppdsl.semantics import CommModel

torch = pytest.importorskip("torch")

STAGES_WIDTH = 6


def program(text: str) -> Program:
    return parse(text, "test.pps")


def generated(gen: str, ranks: int = 2, microbatches: int = 4) -> Program:
    return program(f"pipeline ranks={ranks} microbatches={microbatches}\nuse {gen}\n")


class Block(torch.nn.Module):
    """A user's own module: a Linear, a nonlinearity, a LayerNorm (a weight that is not a Linear's)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(width, width)
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x: Any) -> Any:
        return self.norm(torch.tanh(self.fc(x)))


def model(stages: int, seed: int = 0) -> list[Any]:
    torch.manual_seed(seed)
    return [Block(STAGES_WIDTH).double() for _ in range(stages)]


def batch(rows: int = 8, seed: int = 1) -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, STAGES_WIDTH, generator=g, dtype=torch.float64),
            torch.randn(rows, STAGES_WIDTH, generator=g, dtype=torch.float64))


def loss_fn(y: Any, target: Any) -> Any:
    return ((y - target) ** 2).mean()


def reference_grads(layers: list[Any], x: Any, target: Any, microbatches: int) -> list[list[Any]]:
    """The unpipelined model's gradients of the mean over microbatches of each microbatch's loss."""
    for layer in layers:
        layer.zero_grad()
    for xm, tm in zip(x.chunk(microbatches), target.chunk(microbatches)):
        y = xm
        for layer in layers:
            y = layer(y)
        (loss_fn(y, tm) / microbatches).backward()
    return [[p.grad.clone() for p in layer.parameters()] for layer in layers]


def run_pipeline(prog: Program, *, steps: int = 1, model_: CommModel = CommModel.BUFFERED,
                 seed: int = 0, loop: Loopback | None = None, build: Callable[[int, int], list[Any]] | None = None,
                 **options: Any) -> tuple[list[Any], list[Any], list[list[float]]]:
    """Run `prog` over loopback ranks; returns (the pipeline's stage layers, the same model's
    copy for the reference, each rank's losses of the last step). `build(stages, seed)`: the
    model's stages (default: `model`)."""
    build = build or model
    layers = build(prog.stages, seed)
    reference = build(prog.stages, seed)
    x, target = batch()
    loop = loop or Loopback("torch", prog.ranks, model=model_, timeout=10.0)

    def rank_main(rank: int) -> list[float]:
        mine = {s: layers[s] for s in prog.stages_of(rank)}
        sched = PipelineSchedule(prog, mine, loss_fn, transport=loop.links(rank), **options)
        losses: list[Any] = []
        try:
            for _ in range(steps):
                for s in mine:
                    mine[s].zero_grad()
                losses = []
                sched.step(x, target=target, losses=losses)
        finally:
            sched.close()
        return [float(v) for v in losses]

    results = loop.run(rank_main)
    return layers, reference, results


def assert_exact(prog: Program, layers: list[Any], reference: list[Any]) -> None:
    x, target = batch()
    want = reference_grads(reference, x, target, prog.microbatches)
    for s, layer in enumerate(layers):
        for p, w in zip(layer.parameters(), want[s]):
            assert p.grad is not None, f"stage {s}: a parameter has no gradient"
            torch.testing.assert_close(p.grad, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("gen", ["gpipe()", "1f1b()", "zb1p()", "zbv()", "interleaved_1f1b(virtual=2)",
                                 "dualpipev()"])
def test_loopback_schedules_give_the_unpipelined_gradients(gen: str) -> None:
    prog = generated(gen)
    layers, reference, _ = run_pipeline(prog)
    assert_exact(prog, layers, reference)


@pytest.mark.parametrize("comm", [CommModel.BUFFERED, CommModel.RENDEZVOUS, CommModel.GROUPED])
def test_loopback_every_comm_model_runs_1f1b_exactly(comm: CommModel) -> None:
    prog = generated("1f1b()")
    layers, reference, _ = run_pipeline(prog, model_=comm)
    assert_exact(prog, layers, reference)


@pytest.mark.parametrize("guard", [True, False])
def test_loopback_notes_go_out_on_the_first_step_only_and_later_steps_stay_exact(guard: bool) -> None:
    # Three steps: the first agrees shapes (and labels) in notes, the later ones send data alone.
    prog = generated("zb1p()")
    loop = Loopback("torch", prog.ranks, timeout=10.0)
    layers, reference, results = run_pipeline(prog, steps=3, loop=loop, _guard=guard)
    assert_exact(prog, layers, reference)
    assert results[0] == [] and len(results[1]) == prog.microbatches
    # One note per send of one step, each activation's and each gradient's (with the guard or not).
    assert len(loop.notes) == 2 * prog.microbatches * (prog.stages - 1)


FACING = ("pipeline ranks=2 microbatches=2 stages=4 placement=v\n"
          "rank 0: 0F0 0SEND_F0 0F1 <0SEND_F1 3RECV_F0> 3F0 3I0 3SEND_B0 3W0 3RECV_F1 3F1 3I1 3W1 3SEND_B1 "
          "0RECV_B0 0I0 0W0 0RECV_B1 0I1 0W1\n"
          "rank 1: 1RECV_F0 1F0 2F0 <2SEND_F0 1RECV_F1> 1F1 2F1 2RECV_B0 2I0 2SEND_F1 2W0 1I0 1W0 2RECV_B1 "
          "1SEND_B0 2I1 2W1 1I1 1SEND_B1 1W1\n")


@pytest.mark.parametrize("guard", [True, False])
def test_loopback_facing_batches_that_each_send_a_new_activation_run_under_grouped(guard: bool) -> None:
    # Both ranks send first inside batches that face each other, each sending an activation the
    # other has not seen: sound under `grouped` only. Its first step waited forever once (the
    # shape headers travelled on the links, each side's first group call holding a send whose
    # data the other received only in its second).
    prog = program(FACING)
    assert not lint(prog, CommModel.GROUPED) and lint(prog, CommModel.RENDEZVOUS)
    layers, reference, _ = run_pipeline(prog, model_=CommModel.GROUPED, steps=2, _guard=guard)
    assert_exact(prog, layers, reference)


def test_loopback_split_backward_off_is_exact_too() -> None:
    prog = generated("zbv()")
    layers, reference, _ = run_pipeline(prog, split_backward=False)
    assert_exact(prog, layers, reference)


def test_loopback_losses_are_the_unpipelined_losses() -> None:
    prog = generated("1f1b()")
    _, reference, results = run_pipeline(prog)
    x, target = batch()
    want = []
    for xm, tm in zip(x.chunk(prog.microbatches), target.chunk(prog.microbatches)):
        y = xm
        for layer in reference:
            y = layer(y)
        want.append(float(loss_fn(y, tm).detach()))
    assert results[1] == pytest.approx(want, rel=1e-12)


def test_loopback_the_label_guard_names_both_actions() -> None:
    # Rank 1 receives microbatch 1 before 0: unchecked, the guard must stop it on the first step.
    prog = program("pipeline ranks=2 microbatches=2\n"
                   "rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1\n"
                   "rank 1: 1RECV_F1 1RECV_F0 1F0 1B0 1SEND_B0 1F1 1B1 1SEND_B1\n")
    with pytest.raises(MessageOrderError, match=r"expects `0SEND_F1`, but message number 1 .* is `0SEND_F0`"):
        run_pipeline(prog, check=False)


def test_loopback_a_program_that_deadlocks_is_refused_before_a_message() -> None:
    prog = program("pipeline ranks=2 microbatches=1\n"
                   "rank 0: 0RECV_B0 0F0 0SEND_F0 0B0\n"
                   "rank 1: 1RECV_F0 1F0 1B0 1SEND_B0\n")
    with pytest.raises(Exception, match="PPS"):
        run_pipeline(prog)


def test_loopback_a_failing_rank_ends_the_others_waits_at_once() -> None:
    prog = generated("1f1b()")

    def boom(ctx: ActionContext) -> None:
        if ctx.op.stage == 1 and ctx.microbatch == 2:
            raise ValueError("stage 1 cannot take microbatch 2")
        ctx.default()

    with pytest.raises(StepError, match=r"rank 1, step 0, action 1F2: ValueError: stage 1 cannot take microbatch 2"):
        run_pipeline(prog, handlers={"F": boom})


def test_loopback_register_handler_wraps_the_built_in_one() -> None:
    seen: list[str] = []

    def note(ctx: ActionContext) -> None:
        seen.append(ctx.label)
        ctx.default()

    registration = register_handler("W", note)
    try:
        prog = generated("zb1p()")
        layers, reference, _ = run_pipeline(prog)
    finally:
        registration.remove()
    assert_exact(prog, layers, reference)  # the built-in W still ran
    assert sorted(seen) == sorted(f"{s}W{m}" for s in range(2) for m in range(prog.microbatches))
    seen.clear()
    run_pipeline(generated("zb1p()"))
    assert seen == []  # removed: schedules built afterwards run the built-in one alone


def test_loopback_a_handler_that_replaces_w_is_caught_by_the_guard() -> None:
    # A W handler that computes nothing: the deferred weight gradients are lost, and the
    # guard says so instead of training on wrong gradients.
    with pytest.raises(StepError, match="computed no weight gradient|no gradient"):
        run_pipeline(generated("zb1p()"), handlers={Kind.W: lambda ctx: None})


def test_loopback_handlers_see_their_stage_and_its_buffers() -> None:
    shapes: dict[str, list[int]] = {}

    def after_forward(ctx: ActionContext) -> None:
        ctx.default()
        assert ctx.stage is not None and ctx.microbatch is not None
        shapes[ctx.label] = list(ctx.stage.outputs[ctx.microbatch].shape)

    run_pipeline(generated("1f1b()"), handlers={"F": after_forward})
    assert shapes["0F0"] == [2, STAGES_WIDTH] and shapes["1F3"] == []  # the last stage keeps its loss


def test_loopback_an_unknown_kind_is_refused_with_the_kinds() -> None:
    with pytest.raises(ValueError, match=r"'X' is not an action kind; the kinds are F, I, W, B"):
        register_handler("X", lambda ctx: None)


def test_loopback_stage_only_kinds_reach_their_handlers() -> None:
    seen: list[str] = []

    def note(ctx: ActionContext) -> None:
        seen.append(ctx.label)
        assert ctx.microbatch is None and ctx.stage is not None
        ctx.default()

    prog = program("pipeline ranks=2 microbatches=2\n"
                   "rank 0: 0UNSHARD 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1 0RESHARD 0REDUCE_GRAD\n"
                   "rank 1: 1UNSHARD 1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 1RESHARD 1REDUCE_GRAD\n")
    own: Mapping[str, Callable[[ActionContext], None]] = {"UNSHARD": note, "RESHARD": note, "REDUCE_GRAD": note}
    layers, reference, _ = run_pipeline(prog, handlers=own)
    assert_exact(prog, layers, reference)
    assert sorted(seen) == sorted(f"{s}{k}" for s in range(2) for k in ("UNSHARD", "RESHARD", "REDUCE_GRAD"))


def test_loopback_ranks_that_hold_different_programs_fail_together() -> None:
    a = generated("1f1b()")
    b = generated("gpipe()")
    layers = model(2)
    loop = Loopback("torch", 2, timeout=10.0)

    def rank_main(rank: int) -> None:
        PipelineSchedule(a if rank == 0 else b, {rank: layers[rank]}, loss_fn, transport=loop.links(rank))

    with pytest.raises(SetupError, match="the ranks do not hold the same program"):
        loop.run(rank_main)


def test_loopback_a_wait_that_outlives_its_timeout_names_the_action() -> None:
    # Rank 1 never steps: rank 0's receive gives up after the loopback's timeout.
    prog = generated("1f1b()")
    layers = model(2)
    loop = Loopback("torch", 2, timeout=0.5)
    x, target = batch()

    def rank_main(rank: int) -> None:
        sched = PipelineSchedule(prog, {rank: layers[rank]}, loss_fn, transport=loop.links(rank))
        if rank == 0:
            sched.step(x, target=target)

    with pytest.raises(StepError, match=r"rank 0, step 0, action 0RECV_B0: timed out after 0.5 s waiting for (a note from )?rank 1"):
        loop.run(rank_main)


def test_loopback_replicas_average_their_gradients_over_the_whole_batch() -> None:
    # 2 pipeline ranks x 2 replicas: each replica trains on half the batch, and the reduction
    # leaves every replica with the gradients of the whole batch.
    prog = generated("zb1p()")
    replicas = [model(2) for _ in range(2)]
    reference = model(2)
    x, target = batch(16)
    loop = Loopback("torch", 2, replicas=2, timeout=10.0)

    def rank_main(rank: int) -> None:
        links = loop.links(rank)
        layout = links.layout
        mine = {s: replicas[layout.replica][s] for s in prog.stages_of(layout.pipeline_rank)}
        sched = PipelineSchedule(prog, mine, loss_fn, transport=links)
        lo, hi = layout.share(16)
        try:
            sched.step(x[lo:hi], target=target[lo:hi])
        finally:
            sched.close()

    loop.run(rank_main)
    want = reference_grads(reference, x, target, 2 * prog.microbatches)
    for layers in replicas:
        for s, layer in enumerate(layers):
            for p, w in zip(layer.parameters(), want[s]):
                torch.testing.assert_close(p.grad, w, rtol=1e-10, atol=1e-12)


def test_loopback_a_reduce_grad_before_the_last_backward_is_refused_with_replicas() -> None:
    prog = program("pipeline ranks=1 microbatches=2\nrank 0: 0F0 0B0 0REDUCE_GRAD 0F1 0B1\n")
    layers = model(1)
    loop = Loopback("torch", 1, replicas=2, timeout=10.0)

    def rank_main(rank: int, check: bool) -> None:
        PipelineSchedule(prog, {0: layers[0]}, loss_fn, transport=loop.links(rank), check=check)

    # The checker says so first (PPS113); without it, the runtime itself refuses before step 1.
    with pytest.raises(PpsError, match=r"PPS113.*`0REDUCE_GRAD` at step 2 reduces stage 0's gradients before `0B1`"):
        loop.run(lambda rank: rank_main(rank, True))
    loop = Loopback("torch", 1, replicas=2, timeout=10.0)
    with pytest.raises(SetupError, match=r"0REDUCE_GRAD comes before 0B1, the last backward of stage 0 on rank 0"):
        loop.run(lambda rank: rank_main(rank, False))


def test_loopback_profile_counts_the_live_microbatches_the_checker_predicts() -> None:
    from ppdsl.memory import peak_stage_activations

    prog = generated("1f1b()", microbatches=4)
    layers = model(2)
    x, target = batch()
    loop = Loopback("torch", 2, timeout=10.0)

    def rank_main(rank: int) -> tuple[int, int]:
        sched = PipelineSchedule(prog, {rank: layers[rank]}, loss_fn, transport=loop.links(rank), profile=True)
        sched.step(x, target=target)
        sched.close()
        return sched.memory.peak_graphs, sched.memory.peak_bytes

    counted = loop.run(rank_main)
    assert [graphs for graphs, _ in counted] == list(peak_stage_activations(prog))
    assert all(bytes_ > 0 for _, bytes_ in counted)


def test_loopback_return_output_merges_the_last_stage_outputs() -> None:
    prog = generated("1f1b()")
    layers = model(2)
    reference = model(2)
    x, target = batch()
    loop = Loopback("torch", 2, timeout=10.0)

    def rank_main(rank: int) -> Any:
        sched = PipelineSchedule(prog, {rank: layers[rank]}, loss_fn, transport=loop.links(rank))
        return sched.step(x, target=target, return_output=True)

    outputs = loop.run(rank_main)
    with torch.no_grad():
        torch.testing.assert_close(outputs[1], reference[1](reference[0](x)))
    assert outputs[0] is None


def test_loopback_paddle_layers_of_a_user_class_are_exact() -> None:
    paddle = pytest.importorskip("paddle")

    class PaddleBlock(paddle.nn.Layer):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.fc = paddle.nn.Linear(STAGES_WIDTH, STAGES_WIDTH)
            self.norm = paddle.nn.LayerNorm(STAGES_WIDTH)

        def forward(self, x: Any) -> Any:
            return self.norm(paddle.tanh(self.fc(x)))

    paddle.set_default_dtype("float64")
    try:
        paddle.seed(3)
        layers = [PaddleBlock() for _ in range(2)]
        reference = [PaddleBlock() for _ in range(2)]
    finally:
        paddle.set_default_dtype("float32")
    for mine, ref in zip(layers, reference):
        ref.set_state_dict(mine.state_dict())
    xt, tt = batch()
    x, target = paddle.to_tensor(xt.numpy()), paddle.to_tensor(tt.numpy())
    prog = generated("zb1p()")
    loop = Loopback("paddle", 2, timeout=10.0)

    def paddle_loss(y: Any, t: Any) -> Any:
        return ((y - t) ** 2).mean()

    def rank_main(rank: int) -> None:
        sched = PipelineSchedule(prog, {rank: layers[rank]}, paddle_loss, transport=loop.links(rank))
        sched.step(x, target=target)
        sched.close()

    loop.run(rank_main)
    for xm, tm in zip(paddle.chunk(x, 4), paddle.chunk(target, 4)):
        (paddle_loss(reference[1](reference[0](xm)), tm) / 4).backward()
    for mine, ref in zip(layers, reference):
        for p, q in zip(mine.parameters(), ref.parameters()):
            assert p.grad is not None
            assert abs(p.grad.numpy() - q.grad.numpy()).max() < 1e-10


@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_loopback_every_kind_of_the_table_has_a_handler_on_each_runtime(framework: str) -> None:
    from ppdsl.kinds import KINDS
    from ppdsl.runtime.interpreter import handlers

    for deferred in (None, object()):
        table = handlers.table(deferred)  # type: ignore[arg-type]
        for row in KINDS:
            if framework in row.runtimes:
                assert row.value in table, f"{row.name} has no handler"


def test_loopback_a_kind_without_a_handler_or_its_runtime_is_named() -> None:
    from ppdsl.kinds import TABLE
    from ppdsl.runtime.interpreter import handlers
    from ppdsl.runtime.interpreter.plan import compile_rank

    prog = program("pipeline ranks=1 microbatches=1\nrank 0: 0UNSHARD 0F0 0B0\n")
    plan = compile_rank(prog, 0)
    table = handlers.table(None)
    assert handlers.unrunnable(plan, table, "torch") is None
    rows = dict(TABLE.by_value)
    rows[int(Kind.UNSHARD)] = rows[int(Kind.UNSHARD)]._replace(runtimes=frozenset(("paddle",)))
    assert handlers.unrunnable(plan, table, "torch", rows) == (
        "rank 0 has 0UNSHARD, but the torch runtime has no handler for UNSHARD actions "
        "(the table of action kinds says: paddle)")
    del table[int(Kind.UNSHARD)]
    assert "no handler for UNSHARD" in (handlers.unrunnable(plan, table, "paddle") or "")


def test_loopback_one_rank_s_refusal_stops_every_rank_before_a_message(monkeypatch: pytest.MonkeyPatch) -> None:
    from ppdsl.runtime.interpreter import handlers

    real = handlers.unrunnable
    monkeypatch.setattr(handlers, "unrunnable", lambda plan, table, fw: "rank 1 cannot" if plan.rank == 1
                        else real(plan, table, fw))
    prog = generated("1f1b()")
    layers = model(2)
    loop = Loopback("torch", 2, timeout=10.0)

    def rank_main(rank: int) -> str:
        try:
            PipelineSchedule(prog, {rank: layers[rank]}, loss_fn, transport=loop.links(rank))
        except SetupError as exc:
            return str(exc)
        return "built"

    assert loop.run(rank_main) == ["rank 1 cannot", "rank 1 cannot"]


@pytest.mark.parametrize("gen", ["1f1b()", "zbv()", "interleaved_1f1b(virtual=2)"])
def test_loopback_a_file_with_the_sharding_actions_expand_places_runs_exactly(gen: str) -> None:
    from ppdsl.shard_actions import add_shard_actions

    prog = add_shard_actions(generated(gen), window=1)
    layers, reference, _ = run_pipeline(prog, steps=2)
    assert_exact(prog, layers, reference)


@pytest.mark.parametrize("gen", ["1f1b()", "zbv()"])
def test_loopback_clipping_by_the_global_norm_is_the_unpipelined_model_s(gen: str) -> None:
    prog = generated(gen)
    layers, reference = model(prog.stages), model(prog.stages)
    x, target = batch()
    loop = Loopback("torch", prog.ranks, timeout=10.0)

    def rank_main(rank: int) -> float:
        mine = {s: layers[s] for s in prog.stages_of(rank)}
        sched = PipelineSchedule(prog, mine, loss_fn, transport=loop.links(rank))
        try:
            sched.step(x, target=target)
            return sched.clip_grad_norm(0.05)
        finally:
            sched.close()

    norms = loop.run(rank_main)
    reference_grads(reference, x, target, prog.microbatches)
    want = torch.nn.utils.clip_grad_norm_([p for layer in reference for p in layer.parameters()], 0.05)
    assert float(want) > 0.05  # it did clip
    assert norms == [pytest.approx(float(want), rel=1e-12)] * prog.ranks
    for layer, ref in zip(layers, reference):
        for p, w in zip(layer.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, w.grad, rtol=1e-10, atol=1e-12)


def test_loopback_clipping_refuses_a_max_norm_that_is_no_limit() -> None:
    prog = program("pipeline ranks=1 microbatches=1\nrank 0: 0F0 0B0\n")
    sched = PipelineSchedule(prog, {0: model(1)[0]}, loss_fn, transport=Loopback("torch", 1).links(0))
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="max_norm must be a finite number above 0"):
            sched.clip_grad_norm(bad)
    sched.close()


@pytest.mark.parametrize("spoil", [None, "gradient", "loss"])
def test_loopback_every_rank_agrees_whether_the_step_is_finite(spoil: str | None) -> None:
    prog = generated("1f1b()")
    layers = model(prog.stages)
    x, target = batch()
    loop = Loopback("torch", prog.ranks, timeout=10.0)

    def rank_main(rank: int) -> bool:
        mine = {s: layers[s] for s in prog.stages_of(rank)}
        sched = PipelineSchedule(prog, mine, loss_fn, transport=loop.links(rank))
        losses: list[Any] = []
        try:
            sched.step(x, target=target, losses=losses)
            if spoil == "gradient" and rank == 0:  # one rank's gradient only
                next(iter(mine.values())).fc.weight.grad[0, 0] = float("nan")
            if spoil == "loss" and losses:
                losses[0] = torch.tensor(float("inf"))
            return sched.gradients_finite(losses)
        finally:
            sched.close()

    assert loop.run(rank_main) == [spoil is None] * prog.ranks


# --- recompute: R runs a forward again from the input its F kept -----------------------------
def with_recompute(gen: str, placement: str = "loop", ranks: int = 2, microbatches: int = 4) -> Program:
    """`gen`'s program with an R of every (stage, microbatch) just before its first backward."""
    prog = generated(gen, ranks, microbatches)
    rows = []
    for r, row in enumerate(prog.rows):
        words, seen = [], set()
        for a in row:
            if a.kind in (Kind.B, Kind.I) and (a.stage, a.microbatch) not in seen:
                seen.add((a.stage, a.microbatch))
                words.append(f"{a.stage}R{a.microbatch}")
            words.append(f"{a.stage}{a.kind.name}{a.microbatch}")
        rows.append(f"rank {r}: {' '.join(words)}")
    return program(f"pipeline ranks={ranks} microbatches={microbatches} stages={prog.stages} placement={placement}\n"
                   + "\n".join(rows) + "\n")


class Dropped(torch.nn.Module):
    """A block with dropout: an R must draw the mask its F drew."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.block = Block(width)
        self.drop = torch.nn.Dropout(0.3)

    def forward(self, x: Any) -> Any:
        return self.drop(self.block(x))


@pytest.mark.parametrize(("gen", "placement"), [("1f1b()", "loop"), ("zb1p()", "loop"), ("zbv()", "v"),
                                                ("interleaved_1f1b(virtual=2)", "loop")])
def test_loopback_recompute_gives_the_unpipelined_gradients(gen: str, placement: str) -> None:
    prog = with_recompute(gen, placement)
    assert any(a.kind == Kind.R for row in prog.rows for a in row)
    layers, reference, _ = run_pipeline(prog)
    assert_exact(prog, layers, reference)


def test_loopback_recompute_draws_the_forwards_random_numbers_again() -> None:
    """Dropout in every stage, one rank holding both stages of a 1-rank program: the R's mask is
    its F's, and the draws after it are those of a run without R (the reference's)."""
    prog = program("pipeline ranks=1 microbatches=2 stages=2 placement=loop\n"
                   "rank 0: 0F0 1F0 0F1 1F1 1R0 1B0 0R0 0B0 1R1 1B1 0R1 0B1\n")
    torch.manual_seed(0)
    layers = [Dropped(STAGES_WIDTH).double() for _ in range(2)]
    reference = copy.deepcopy(layers)
    x, target = batch()
    loop = Loopback("torch", 1, timeout=10.0)

    def rank_main(rank: int) -> list[float]:
        sched = PipelineSchedule(prog, {0: layers[0], 1: layers[1]}, loss_fn, transport=loop.links(rank))
        torch.manual_seed(7)
        losses: list[Any] = []
        try:
            sched.step(x, target=target, losses=losses)
        finally:
            sched.close()
        return [float(v) for v in losses]

    losses = loop.run(rank_main)[0]
    after = torch.rand(1)
    torch.manual_seed(7)  # the reference draws the masks in the same order: F0 (0, 1), F1 (0, 1)
    ys = []
    for xm in x.chunk(2):
        ys.append(reference[1](reference[0](xm)))
    want_losses = [float(loss_fn(y, t).detach()) for y, t in zip(ys, target.chunk(2))]
    sum(loss_fn(y, t) / 2 for y, t in zip(ys, target.chunk(2))).backward()
    assert torch.equal(after, torch.rand(1))  # R left the generator where a run without it does
    assert losses == pytest.approx(want_losses, rel=1e-12)
    for layer, ref in zip(layers, reference):
        for p, w in zip(layer.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, w.grad, rtol=1e-10, atol=1e-12)


def test_loopback_recompute_of_a_stage_with_batch_norm_is_refused_on_every_rank() -> None:
    prog = with_recompute("1f1b()")
    loop = Loopback("torch", prog.ranks, timeout=10.0)
    layers = [torch.nn.Sequential(torch.nn.Linear(STAGES_WIDTH, STAGES_WIDTH), torch.nn.BatchNorm1d(STAGES_WIDTH))
              for _ in range(prog.stages)]

    def rank_main(rank: int) -> str:
        with pytest.raises(SetupError) as info:
            PipelineSchedule(prog, {s: layers[s] for s in prog.stages_of(rank)}, loss_fn, transport=loop.links(rank))
        return str(info.value)

    said = loop.run(rank_main)
    assert all("stage 0 has R actions, but its 1 (updates running statistics in training)" in s for s in said), said


# --- OFFLOAD and RELOAD: what a forward saved, to host memory and back -------------------------
@pytest.mark.parametrize("call", ["1f1b(offload=all)", "zb1p(offload=all)", "interleaved_1f1b(virtual=2, offload=1)",
                                  "1f1b(recompute=1, offload=all)", "pipeoffload(virtual=2, chunks=2)"])
def test_loopback_offload_and_reload_give_the_unpipelined_gradients(call: str) -> None:
    prog = generated(call)
    # (label, tensors moved, tensors left on the device that neither the stage nor the batch holds)
    moved: list[tuple[str, int, int]] = []

    def spy(ctx: ActionContext) -> None:
        ctx.default()
        assert ctx.stage is not None
        m = ctx.op.microbatch
        saved = ctx.stage.saved.get(m, [])
        kept = [store[m] for store in (ctx.stage.inputs, ctx.stage.outputs, ctx.schedule.inputs, ctx.schedule.targets)
                if (m in store if isinstance(store, dict) else m < len(store))]
        held = {t.data_ptr() for v in kept for t in (v if isinstance(v, (list, tuple)) else [v])
                if isinstance(t, torch.Tensor)}
        moved.append((ctx.op.label, sum(s.tensor is None for s in saved),
                      sum(s.tensor is not None and s.tensor.data_ptr() not in held for s in saved)))

    layers, reference, _ = run_pipeline(prog, handlers={Kind.OFFLOAD: spy})
    assert_exact(prog, layers, reference)
    assert moved and all(n > 0 and left == 0 for _, n, left in moved), moved


class Reshaping(torch.nn.Module):
    """Autograd saves one buffer under two shapes (`h` by the product, its reshape by `bmm`)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(width, width)

    def forward(self, x: Any) -> Any:
        h = self.fc(x)
        gated = h * torch.sigmoid(h)
        a = h.reshape(-1, 2, width_half := STAGES_WIDTH // 2)
        s = torch.tanh(torch.bmm(a, a.transpose(1, 2))).sum(-1)  # [rows, 2]
        return gated + s.repeat(1, width_half)


def reshaping(stages: int, seed: int = 0) -> list[Any]:
    torch.manual_seed(seed)
    return [Reshaping(STAGES_WIDTH).double() for _ in range(stages)]


@pytest.mark.parametrize("call", ["1f1b(offload=all)", "zb1p(offload=all)"])
def test_loopback_offload_moves_a_buffer_saved_under_two_shapes_once(call: str) -> None:
    prog = generated(call)
    moved: list[int] = []

    def spy(ctx: ActionContext) -> None:
        ctx.default()
        assert ctx.stage is not None
        saved = [s for s in ctx.stage.saved.get(ctx.op.microbatch, []) if s.tensor is None]
        moved.append(len(saved) - len({id(s.host) for s in saved}))  # Saved sharing a host copy

    layers, reference, _ = run_pipeline(prog, handlers={Kind.OFFLOAD: spy}, build=reshaping)
    assert_exact(prog, layers, reference)
    assert moved and all(shared >= 1 for shared in moved), moved


# --- eval: the training schedule's forwards only, under no gradient ---------------------------
@pytest.mark.parametrize("gen", ["1f1b()", "zbv()", "interleaved_1f1b(virtual=2)", "zb1p(recompute=all)"])
def test_loopback_eval_runs_the_forwards_only_and_changes_no_gradient(gen: str) -> None:
    prog = generated(gen)
    layers = model(prog.stages)
    reference = model(prog.stages)
    x, target = batch()
    loop = Loopback("torch", prog.ranks, timeout=10.0)
    last = prog.rank_of(prog.stages - 1)

    def rank_main(rank: int) -> tuple[Any, list[Any], list[Any], list[Any]]:
        mine = {s: layers[s] for s in prog.stages_of(rank)}
        sched = PipelineSchedule(prog, mine, loss_fn, transport=loop.links(rank))
        try:
            sched.step(x, target=target)
            grads = [p.grad.clone() for s in sorted(mine) for p in mine[s].parameters()]
            losses: list[Any] = []
            out = None
            for _ in range(2):  # the forward-only schedule is made once and reused
                losses = []
                out = sched.eval(x, target=target, losses=losses)
            after = [p.grad for s in sorted(mine) for p in mine[s].parameters()]
        finally:
            sched.close()
        return out, losses, grads, after

    results = loop.run(rank_main)
    with torch.no_grad():
        want = x
        for layer in reference:
            want = layer(want)
    for rank, (out, losses, grads, after) in enumerate(results):
        assert all(torch.equal(a, b) for a, b in zip(grads, after)), "eval changed a gradient"
        if rank == last:
            assert out is not None and out.grad_fn is None and not out.requires_grad
            torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
            want_losses = [float(loss_fn(o, t)) for o, t in zip(want.chunk(prog.microbatches),
                                                                 target.chunk(prog.microbatches))]
            assert [float(v) for v in losses] == pytest.approx(want_losses, rel=1e-12)
        else:
            assert out is None and losses == []


# --- a rank that stops on the first step tells the ranks waiting for it ------------------------
@pytest.mark.parametrize("gen", ["1f1b()", "zbv()"])
def test_loopback_targets_missing_on_one_rank_is_the_same_error_on_every_rank(gen: str) -> None:
    import time

    prog = generated(gen, ranks=2)
    layers = model(prog.stages)
    x, target = batch()
    last = prog.rank_of(prog.stages - 1)
    loop = Loopback("torch", prog.ranks, timeout=20.0)

    def rank_main(rank: int) -> str:
        sched = PipelineSchedule(prog, {s: layers[s] for s in prog.stages_of(rank)}, loss_fn,
                                 transport=loop.links(rank))
        try:
            sched.step(x, target=None if rank == last else target)  # the last stage's rank forgot it
        except (SetupError, StepError) as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            sched.close()
        return "ran"

    t0 = time.monotonic()
    said = loop.run(rank_main)
    assert time.monotonic() - t0 < 10, "a rank waited for its timeout"
    reason = "the last stage needs the batch's targets: step(inputs, target=...)"
    assert said[last] == f"SetupError: {reason}"
    for rank, text in enumerate(said):
        if rank != last:
            assert text.startswith("StepError: ") and f"rank {last} stopped before step 0: {reason}" in text, said
