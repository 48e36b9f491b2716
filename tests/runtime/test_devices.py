"""Which device a rank binds (`ppdsl.runtime.jobs.devices.choose_device`), given made-up counts and
launcher environments: every branch, with no GPU needed. Then what this CPU machine's real
adapters answer, and `ppdsl run --device gpu` refused here before any process starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppdsl.cli import main
from ppdsl.runtime.jobs.devices import (CPU, GPU, CPU_DEVICE, Device, DeviceError, assigned_gpu, choose_device,
                                   hints_of_gpus, local_position)

HERE = Path(__file__).parent
TORCHRUN = {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "RANK": "3", "WORLD_SIZE": "4"}
PADDLE_LAUNCH = {"PADDLE_LOCAL_RANK": "1", "PADDLE_LOCAL_SIZE": "2", "FLAGS_selected_gpus": "5"}


def test_cpu_is_always_the_cpu_and_asks_nothing() -> None:
    for built, visible in ((False, 0), (True, 8)):
        d = choose_device(CPU, built, visible, 0, 1, PADDLE_LAUNCH)
        assert d.kind == CPU and d.name == "cpu" and d.backend == "gloo" and not d.is_gpu


def test_auto_takes_gpu_local_rank_when_every_local_process_has_one() -> None:
    d = choose_device("auto", True, 4, 3, 4, {})
    assert d == Device(GPU, 3, d.why) and d.name == "gpu:3" and d.backend == "nccl"
    assert "local rank 3, 4 GPUs visible" == d.why


def test_auto_falls_back_to_the_cpu_for_every_process_alike() -> None:
    # 4 local ranks, 2 GPUs: not ranks 0-1 on GPUs and 2-3 on the CPU (gloo and NCCL do not mix).
    for local in range(4):
        d = choose_device("auto", True, 2, local, 4, {})
        assert d.kind == CPU and "4 processes on this machine need 4 GPUs but 2 GPUs are visible" in d.why
    d = choose_device("auto", False, 0, 0, 2, {})
    assert d.kind == CPU and "built without CUDA" in d.why


def test_gpu_that_cannot_be_had_names_the_counts() -> None:
    with pytest.raises(DeviceError, match=r"--device gpu: 4 processes on this machine need 4 GPUs but 1 GPU is visible"):
        choose_device(GPU, True, 1, 0, 4, {})
    with pytest.raises(DeviceError, match=r"--device gpu: the framework is built without CUDA"):
        choose_device(GPU, False, 0, 0, 1, {})
    with pytest.raises(DeviceError, match=r"this process was given GPU 5 but 2 GPUs are visible \(indices 0-1\)"):
        choose_device(GPU, True, 2, 1, 2, PADDLE_LAUNCH)
    with pytest.raises(DeviceError, match="--device must be one of auto, cpu, gpu"):
        choose_device("tpu", True, 8, 0, 1, {})


def test_paddles_launcher_assignment_wins_over_the_local_rank() -> None:
    d = choose_device(GPU, True, 8, 1, 2, PADDLE_LAUNCH)
    assert d.index == 5 and d.why == "FLAGS_selected_gpus=5, 8 GPUs visible"
    # One process given every GPU: it binds the first, as paddle.distributed.ParallelEnv does.
    assert choose_device("auto", True, 8, 0, 1, {"FLAGS_selected_gpus": "2,3"}).index == 2
    assert assigned_gpu({"FLAGS_selected_gpus": ""}) is None and assigned_gpu({}) is None


def test_torchrun_gives_local_rank() -> None:
    local, size = local_position(TORCHRUN, 3, 4)
    assert (local, size) == (1, 2)
    assert choose_device("auto", True, 2, local, size, TORCHRUN) == Device(GPU, 1, "local rank 1, 2 GPUs visible")
    assert local_position(PADDLE_LAUNCH, 3, 4) == (1, 2)
    assert local_position({}, 3, 4) == (3, 4)  # no launcher variable: every process on one machine


def test_gpu_hints_come_from_device_nodes(tmp_path: Path) -> None:
    assert not hints_of_gpus((str(tmp_path / "nvidia[0-9]*"),))
    (tmp_path / "nvidia0").touch()
    assert hints_of_gpus((str(tmp_path / "nvidia[0-9]*"),))
    assert CPU_DEVICE.kind == CPU


@pytest.mark.slow  # importing both frameworks
@pytest.mark.parametrize("framework", ["paddle", "torch"])
def test_this_machines_adapters_see_no_gpu_and_bind_the_cpu(framework: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip(framework)
    monkeypatch.setenv("PADDLE_DISTRI_BACKEND", "gloo")  # what binding the CPU would write, undone after
    import numpy as np

    from ppdsl.runtime.framework import get_framework

    fw = get_framework(framework)
    assert not fw.cuda_built() and fw.device_count() == 0  # the CPU wheels
    fw.set_device(choose_device("auto", fw.cuda_built(), fw.device_count(), 0, 1, {}))
    assert fw.device.kind == CPU and fw.default_backend() == "gloo"
    t = fw.from_numpy(np.zeros(3))
    assert not fw.is_on_gpu(t) and fw.to_device(t) is t
    fw.synchronize()  # nothing queued on a CPU: returns at once
    assert fw.allocator_peak_bytes() is None


def test_run_device_gpu_on_a_cpu_build_is_exit_2_before_any_process(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("paddle")
    code = main(["run", str(HERE / "schedules" / "2r_zb_iw.pps"), "--device", "gpu", "--steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "--device gpu: the framework is built without CUDA" in err and "rank" not in err, err


def test_run_device_takes_only_the_three_choices(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(HERE / "schedules" / "2r_zb_iw.pps"), "--device", "tpu"])
    assert code == 2 and "invalid choice: 'tpu'" in capsys.readouterr().err


def test_the_memory_line_reports_an_allocator_peak_only_where_there_is_one() -> None:
    from ppdsl.cli.run_cmd import memory_line

    m: dict[str, object] = {"rank": 1, "peak_microbatches": 2, "predicted_microbatches": 2, "peak_bytes": 2**20}
    assert "allocator" not in memory_line(m)
    gpu = memory_line({**m, "allocator_peak_bytes": 3 * 2**20, "device": "gpu:1"})
    assert gpu.endswith("1.00 MiB in tensors kept between actions, allocator peak 3.00 MiB on gpu:1")
