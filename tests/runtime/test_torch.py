"""The PyTorch back end: the same files, checks and results as on Paddle.

Real torch processes on gloo over loopback (ppdsl's launcher and torchrun), torch's own
pipelining schedules as the reference, and the Paddle run of the same file as the conformance
reference. Every wait has a timeout (`--timeout`, and `subprocess` limits on the launchers).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ppdsl.load import load_program
from ppdsl.runtime.jobs.launcher import free_ports, launch
from ppdsl.runtime.interpreter.preflight import prepare
from ppdsl.semantics import CommModel

sys.path.insert(0, str(Path(__file__).parent))
from procs import launcher_env as _env  # noqa: E402
from procs import local_progress, progress_lines, rank_result, run_together  # noqa: E402

pytest.importorskip("torch")
HERE = Path(__file__).parent
ROOT = HERE.parents[1]
PPDSL = str(Path(sys.executable).with_name("ppdsl"))
LAUNCH_SECONDS = 150


@pytest.mark.slow
@pytest.mark.parametrize(("order", "torch_class"), [("gpipe()", "ScheduleGPipe"), ("1f1b()", "Schedule1F1B")])
def test_identical_to_torchs_own_schedule(order: str, torch_class: str, tmp_path: Path) -> None:
    f = tmp_path / "s.pps"
    f.write_text(f"pipeline ranks=2 microbatches=4\nuse {order}\n")
    outcome = launch([load_program(str(f))], [str(f), "2", torch_class], steps=0, timeout=60, quiet=True,
                     keep_logs=str(tmp_path), command=[sys.executable, str(HERE / "helpers" / "torch_api_pair.py")])
    assert outcome.code == 0, outcome.failure
    for rank in (0, 1):
        record = rank_result(tmp_path, rank)
        assert len(record["ppdsl"]) == 2 and record["ppdsl"][0]["grads"]
        assert record["ppdsl"] == record["torch"]  # losses and gradients, exactly
        if rank == 1:
            assert len(record["ppdsl"][1]["losses"]) == 4


SHIPPED = sorted(str(p) for p in (ROOT / "schedules").glob("*.pps"))


def _losses(framework: str, files: list[str], tmp_path: Path) -> list[dict[int, float]]:
    programs = [prepare(load_program(f), CommModel.RENDEZVOUS) for f in files]
    argv = [*files, "--steps", "3", "--seed", "7", "--framework", framework, "--verify", "--timeout", "60"]
    outcome = launch(programs, argv, steps=3, timeout=60, quiet=True, keep_logs=str(tmp_path / framework))
    assert outcome.code == 0, outcome.failure
    results = [outcome.file(i) for i in range(len(files))]
    for file, r in zip(files, results):
        assert r.verify is not None and r.verify["ok"], (framework, file, r.verify)
    return [r.losses for r in results]


@pytest.mark.slow
def test_every_shipped_schedule_prints_the_same_losses_on_both_frameworks(tmp_path: Path) -> None:
    pytest.importorskip("paddle")
    assert len(SHIPPED) >= 10 and all(load_program(f).ranks == 4 for f in SHIPPED)
    on_torch = _losses("torch", SHIPPED, tmp_path)
    on_paddle = _losses("paddle", SHIPPED, tmp_path)
    for file, t, p in zip(SHIPPED, on_torch, on_paddle):
        assert sorted(t) == sorted(p) == [0, 1, 2], file
        for step in t:
            assert abs(t[step] - p[step]) <= 1e-5 * abs(p[step]), (file, step, t[step], p[step])


def _stage(seed: int) -> Any:
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _grads(stage: Any) -> dict[str, Any]:
    return {n: p.grad.clone() for n, p in stage.named_parameters() if p.grad is not None}


def test_split_backward_defers_the_weight_gradients_and_equals_the_unsplit_backward_bit_for_bit() -> None:
    import torch

    from ppdsl.runtime.framework import get_framework
    from ppdsl.runtime.interpreter.split_backward import DeferredGrads, SplitLinears

    plain, split = _stage(0), _stage(0)
    store = DeferredGrads(get_framework("torch"))
    linears = SplitLinears({0: split}, store)
    assert [name for name, _ in linears.switched[0]] == ["0", "3"] and linears.kept[0] == {}
    switched = linears.active()
    switched.__enter__()
    xs = [torch.randn(5, 8, dtype=torch.float32, generator=torch.Generator().manual_seed(m)) for m in range(3)]
    dxs = []
    for m, x in enumerate(xs):
        leaf = x.clone().requires_grad_(True)
        plain(leaf).square().sum().backward()
        dxs.append(leaf.grad)
    for m, x in enumerate(xs):  # I(0, m): input, bias and LayerNorm gradients now
        leaf = x.clone().requires_grad_(True)
        store.key = (0, m)
        split(leaf).square().sum().backward()
        store.key = None
        assert torch.equal(leaf.grad, dxs[m])
    assert split[0].weight.grad is None and split[3].weight.grad is None
    assert split[0].bias.grad is not None and split[1].weight.grad is not None
    for m in (2, 0, 1):  # W in another order than the I's
        assert store.run((0, m)) == 2
    assert list(store.tensors()) == []
    want, got = _grads(plain), _grads(split)
    assert sorted(want) == sorted(got)
    for name in want:
        # The same products as autograd's Linear backward, summed in the same order: exact.
        assert torch.equal(got[name], want[name]) or _summed_in_another_order(got[name], want[name]), name
    assert "forward" in vars(split[0])
    switched.__exit__(None, None, None)
    assert "forward" not in vars(split[0])


def _summed_in_another_order(a: Any, b: Any) -> bool:
    """W's sums run in the file's W order (2, 0, 1 here), not microbatch order: float rounding."""
    import torch

    return bool((a - b).abs().max() <= 1e-6 * b.abs().max())


def test_split_backward_in_microbatch_order_is_bit_identical() -> None:
    import torch

    from ppdsl.runtime.framework import get_framework
    from ppdsl.runtime.interpreter.split_backward import DeferredGrads, SplitLinears

    plain, split = _stage(1), _stage(1)
    store = DeferredGrads(get_framework("torch"))
    with SplitLinears({0: split}, store).active():
        _backward_in_microbatch_order(plain, split, store)
    want, got = _grads(plain), _grads(split)
    assert all(torch.equal(got[n], want[n]) for n in want)


def _backward_in_microbatch_order(plain: Any, split: Any, store: Any) -> None:
    import torch

    for m in range(3):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(10 + m))
        plain(x.clone().requires_grad_(True)).sum().backward()
        store.key = (0, m)
        split(x.clone().requires_grad_(True)).sum().backward()
        store.key = None
        store.run((0, m))


def test_one_rank_two_stages_in_a_plain_process() -> None:
    import torch

    from ppdsl.runtime import PipelineSchedule
    from ppdsl.expansion import parse

    program = parse("pipeline ranks=1 microbatches=2 stages=2 placement=[0,0]\n"
                    "rank 0: 0F0 1F0 0F1 1F1 1I0 1W0 0B0 1B1 0B1\n", "<t>")
    torch.manual_seed(0)
    layers = [torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)]
    reference = [torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)]
    for a, b in zip(layers, reference):
        b.load_state_dict(a.state_dict())
    sched = PipelineSchedule(program, layers, lambda o, t: ((o - t) ** 2).mean())
    assert sched.fw.name == "torch" and sched.deferred is not None
    x, y = torch.randn(4, 4, generator=torch.Generator().manual_seed(3)), torch.zeros(4, 1)
    losses: list[Any] = []
    sched.step(x, target=y, losses=losses)
    for xm, ym in zip(x.split(2), y.split(2)):
        (((reference[1](reference[0](xm)) - ym) ** 2).mean() / 2).backward()
    assert len(losses) == 2
    for a, b in zip(layers, reference):
        for p, q in zip(a.parameters(), b.parameters()):
            assert torch.allclose(p.grad, q.grad, rtol=1e-6, atol=1e-7)


def test_a_stage_of_the_other_framework_is_refused() -> None:
    import torch

    from ppdsl.runtime import PipelineSchedule, SetupError
    from ppdsl.expansion import parse

    program = parse("pipeline ranks=1 microbatches=1 stages=2 placement=[0,0]\nrank 0: 0F0 1F0 1B0 0B0\n", "<t>")
    with pytest.raises(SetupError, match="stage 1: expected a torch.nn.Module, got str"):
        PipelineSchedule(program, [torch.nn.Linear(2, 2), "not a module"], lambda o, t: o.sum())


def test_framework_torch_without_torch_says_how_to_install(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['torch'] = None; from ppdsl.cli import main; "
            f"sys.exit(main(['run', {str(ROOT / 'schedules' / '1f1b.pps')!r}, '--framework', 'torch']))")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "PyTorch is not installed: pip install 'ppdsl[torch]'" in r.stderr and "Traceback" not in r.stderr


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


@pytest.mark.slow
def test_under_torchrun_one_node(tmp_path: Path) -> None:
    f = tmp_path / "zb1p.pps"
    f.write_text("pipeline ranks=2 microbatches=4\nuse zb1p()\n")
    (port,) = free_ports(1)
    done = subprocess.run(_torchrun("--nproc_per_node", "2", "--master_port", str(port), PPDSL, "run", str(f),
                                    "--framework", "torch", "--steps", "2", "--verify", "--timeout", "30"),
                          env=_env(), cwd=tmp_path, capture_output=True, text=True, timeout=LAUNCH_SECONDS)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "verify: ok" in done.stdout
    assert [x.split("  ")[0] for x in progress_lines(done.stdout)] == ["step 1/2", "step 2/2"]  # rank 0's, once


@pytest.mark.slow
def test_under_torchrun_two_nodes_on_loopback(tmp_path: Path) -> None:
    f = tmp_path / "1f1b.pps"
    f.write_text("pipeline ranks=4 microbatches=4\nuse 1f1b()\n")
    (port,) = free_ports(1)
    codes, outputs = run_together([_torchrun("--nnodes", "2", "--node_rank", str(node), "--master_addr", "127.0.0.1",
                                             "--master_port", str(port), "--nproc_per_node", "2", PPDSL, "run",
                                             str(f), "--framework", "torch", "--steps", "2", "--verify",
                                             "--timeout", "30") for node in (0, 1)], tmp_path, LAUNCH_SECONDS)
    assert codes == [0, 0], "\n".join(o[-2000:] for o in outputs)
    assert "verify: ok" in outputs[0]
    # Only rank 0 prints progress, the losses rank 3 sent it: those of a local run.
    assert progress_lines(outputs[0]) == local_progress(PPDSL, [str(f), "--framework", "torch", "--steps", "2"],
                                                        tmp_path, LAUNCH_SECONDS)
    assert not progress_lines(outputs[1])


# --- faults: the same messages as on Paddle ------------------------------------------------

def _fault(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, fault: str,
           timeout: str = "4") -> tuple[int, str, float]:
    import time

    from ppdsl.cli import main

    monkeypatch.setenv("PPDSL_FAULT", fault)
    t0 = time.monotonic()
    code = main(["run", str(HERE / "schedules" / "2r_1f1b_batched.pps"), "--framework", "torch", "--steps", "3",
                 "-q", "--timeout", timeout, "--model", f"{HERE / 'helpers' / 'faulty_torch_model.py'}:build_stage"])
    return code, capsys.readouterr().err, time.monotonic() - t0


@pytest.mark.slow
def test_faults_stop_every_rank_and_name_rank_step_action(capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    code, err, seconds = _fault(capsys, monkeypatch, "raise:1:5")  # stage 1's 6th forward: step 1, 1F1
    assert code == 1 and "rank 1, step 1, action 1F1" in err and "boom in the model" in err and seconds < 40
    code, err, seconds = _fault(capsys, monkeypatch, "kill:1:2")
    assert code == 1 and "rank 1 was killed by signal 9 at step 0, action 1F2" in err and seconds < 40
    code, err, seconds = _fault(capsys, monkeypatch, "hang:1:1", timeout="3")
    assert code == 1 and re.search(r"rank 0: timed out after 3 s at step 0, action 0\S+ \(.*rank 1\)", err), err
    assert seconds < 40
