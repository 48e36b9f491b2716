"""Tensor-parallel stages: 2 pipeline ranks x 2 tensor ranks, four real torch processes on gloo
over loopback (eight with two replicas), against the model whole and unpipelined. Every wait
has a timeout (`--timeout`, the launcher's)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from ppdsl.cli import main
from ppdsl.diagnostics import UsageError
from ppdsl.runtime import Layout

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE / "helpers"))
from procs import generator_files  # noqa: E402


def _verified(capsys: pytest.CaptureFixture[str], files: list[str], *argv: str) -> str:
    """Run `files` with `argv` under --verify on torch: what it printed, each file verified."""
    pytest.importorskip("torch")
    code = main(["run", *files, "--steps", "2", "--verify", "--framework", "torch", "--tp", "2", *argv])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    for f in files:
        assert re.search(rf"{re.escape(f)}: 2 steps, .*verify ok", out), out
    return out + err


@pytest.mark.slow
def test_tp_two_by_two_verifies_1f1b_zb1p_zbv_clipped(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # Clipped by the norm over every rank, split gradients counted by part, whole ones once.
    files = generator_files(tmp_path, ("1f1b()", "zb1p()", "zbv()"))
    said = _verified(capsys, files, "--timeout", "60", "--clip-grad-norm", "0.05")
    assert "2 ranks x 2 tensor-parallel ranks (4 processes)" in said
    assert "have a DTensor weight (tensor parallelism)" in said  # the plan split them


@pytest.mark.slow
def test_tp_with_data_parallel_verifies(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    said = _verified(capsys, generator_files(tmp_path, ("zb1p()",)), "--dp", "2", "--timeout", "90")
    assert "2 ranks x 2 replicas x 2 tensor-parallel ranks (8 processes)" in said


@pytest.mark.slow
def test_tp_gpt_example_verifies(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _verified(capsys, generator_files(tmp_path, ("1f1b()",)), "--timeout", "60", "--rtol", "1e-5",
              "--model", str(ROOT / "examples" / "torch" / "gpt" / "model.py"))


@pytest.mark.slow
def test_tp_stages_that_send_dtensors_verify(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # Each tensor rank sends its rows of a DTensor (Shard(0)) and its peer rebuilds the DTensor;
    # the gradients come back the same way. zbv also hands one over on a rank, as it is.
    model = str(ROOT / "examples" / "torch" / "dtensor_messages.py")
    _verified(capsys, generator_files(tmp_path, ("1f1b()", "zb1p()")), "--timeout", "60", "--model", model)
    # docs/runtime.md runs the shipped zbv.pps so: 4 ranks x 2 tensor ranks, 8 processes.
    _verified(capsys, [str(ROOT / "schedules" / "zbv.pps")], "--timeout", "90", "--model", model)


SPREAD = {"placements": [["S", 0]], "shape": [4, 8], "stride": [8, 1]}


@pytest.mark.parametrize("bad, why", [
    ({**SPREAD, "placements": [["X", 0]]}, "placements"),
    ({**SPREAD, "placements": []}, "placements"),
    ({**SPREAD, "placements": [["P", "os.system"]]}, "placements"),
    ({**SPREAD, "shape": [4, -8]}, "shape and stride"),
    ({**SPREAD, "stride": [1]}, "shape and stride"),
    ({**SPREAD, "shape": [1 << 20, 1 << 20], "stride": [1 << 20, 1]}, "shape and stride"),
    ([["S", 0]], ""),
])
def test_a_dtensor_layout_travels_in_a_note_and_a_bad_one_is_refused(bad: object, why: str) -> None:
    from ppdsl.runtime.interpreter.values import StageValueError
    from ppdsl.runtime.transport import messages as M

    meta = {"form": "single", "keys": [], "members": [[[2, 8], "float64", True, SPREAD]]}
    got = M.parse_description(M.decode_note(M.encode_note(None, meta))["value"], M.DTYPES, M.MAX_DIMS,
                              M.MAX_ELEMENTS)
    assert got.spreads == (SPREAD,) and got.shapes == ((2, 8),)  # the part travels, the layout beside it
    assert M.decode_note(M.encode_note(None, grads=[SPREAD, None]))["grads"] == [SPREAD, None]
    assert "grads" not in M.decode_note(M.encode_note(None, grads=[None]))  # plain gradients say nothing
    with pytest.raises(StageValueError, match=f"garbled layout .*{why}"):
        M.parse_spread(bad, M.MAX_DIMS, M.MAX_ELEMENTS)


def _refused(capsys: pytest.CaptureFixture[str], tmp_path: Path, *argv: str) -> str:
    code = main(["run", *generator_files(tmp_path, ("1f1b()",)), "--tp", "2", *argv])
    err = capsys.readouterr().err
    assert code == 2, err
    return err


@pytest.mark.parametrize("argv, message", [
    (["--framework", "paddle"], "Paddle's tensor-parallel layers need fleet.init with a hybrid strategy"),
    (["--framework", "torch", "--fsdp", "2"], "--fsdp and --tp together are not supported yet"),
    (["--framework", "torch", "--profile", "p.json"], "--profile measures one pipeline"),
])
def test_tp_refusals_come_before_any_process(argv: list[str], message: str,
                                            capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert message in _refused(capsys, tmp_path, *argv)


def test_tp_with_a_model_that_has_no_plan_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("torch")
    model = tmp_path / "plain.py"
    model.write_text("import torch\n\ndef build_stage(s, n):\n    return torch.nn.Linear(2, 2)\n")
    err = _refused(capsys, tmp_path, "--model", f"{model}:build_stage", "--framework", "torch")
    assert "has no `parallelize(stage, mesh)`" in err


def test_a_layout_with_tensor_ranks_places_each_rank() -> None:
    # 2 pipeline ranks x 2 replicas x 2 tensor ranks: global rank = (replica * 2 + pipeline rank) * 2 + tensor rank.
    layout = Layout(pipeline=2, replicas=2, rank=6, tensor=2)
    assert (layout.replica, layout.pipeline_rank, layout.tensor_rank, layout.world) == (1, 1, 0, 8)
    assert layout.tensor_ranks() == [6, 7]
    assert layout.global_rank(0) == 4 and layout.data_parallel_ranks(1) == [2, 6]
    assert layout.pair_groups([(0, 1)]) == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert layout.share(8) == (4, 8)  # the tensor ranks of a replica train on the same rows
    with pytest.raises(UsageError, match="not both yet"):
        Layout(pipeline=2, replicas=2, rank=0, shards=2, tensor=2)
