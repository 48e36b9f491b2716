"""Which device a rank binds: one pure rule, fed the framework's counts and the launcher's environment.

A rank binds one device for everything it holds (stages, inputs, messages, optimizer state).
The rule is `choose_device`; it reads no framework and no environment of its own, so every
branch is tested with made-up counts. `hints_of_gpus` says, without importing a framework,
whether asking one is worth its import (~1 s): no NVIDIA or ROCm device node means no GPU.
"""

from __future__ import annotations

import glob
from collections.abc import Mapping

from attrs import frozen

from ...diagnostics import UsageError
from ...wording import plural

CPU, GPU, AUTO = "cpu", "gpu", "auto"
REQUESTS = (AUTO, CPU, GPU)
# Where a cluster launcher names the GPU it gave this process. Paddle's launcher writes the
# index among the visible devices (a list when one process gets all of them: the first one is
# bound, as `paddle.distributed.ParallelEnv` does); torchrun writes only LOCAL_RANK.
PADDLE_SELECTED = "FLAGS_selected_gpus"
LOCAL_RANK_VARIABLES = ("PADDLE_LOCAL_RANK", "LOCAL_RANK")
LOCAL_SIZE_VARIABLES = ("PADDLE_LOCAL_SIZE", "LOCAL_WORLD_SIZE")
# Device nodes of an NVIDIA or ROCm driver: without any, no framework can see a GPU.
GPU_NODES = ("/dev/nvidia[0-9]*", "/dev/kfd")


class DeviceError(UsageError):
    """A device asked for that this machine cannot give (exit 2, before any process starts)."""


@frozen
class Device:
    """One rank's device: `kind` CPU or GPU, `index` among the visible GPUs (0 on CPU)."""

    kind: str
    index: int = 0
    why: str = ""

    @property
    def is_gpu(self) -> bool:
        return self.kind == GPU

    @property
    def name(self) -> str:
        return f"gpu:{self.index}" if self.is_gpu else CPU

    @property
    def backend(self) -> str:
        """The collective backend of a device: gloo moves CPU tensors, NCCL GPU ones."""
        return "nccl" if self.is_gpu else "gloo"


CPU_DEVICE = Device(CPU, 0, "the default")


def assigned_gpu(env: Mapping[str, str]) -> int | None:
    """The GPU index a cluster launcher wrote for this process, if it wrote one."""
    value = env.get(PADDLE_SELECTED, "").split(",")[0].strip()
    return int(value) if value.isdigit() else None


def local_position(env: Mapping[str, str], rank: int, world: int) -> tuple[int, int]:
    """(this process's place among the processes of its machine, how many there are)."""
    local = next((int(env[v]) for v in LOCAL_RANK_VARIABLES if env.get(v, "").isdigit()), rank)
    size = next((int(env[v]) for v in LOCAL_SIZE_VARIABLES if env.get(v, "").isdigit()), world)
    return local, size


def choose_device(requested: str, cuda_built: bool, visible_gpus: int, local_rank: int, local_ranks: int,
                  launcher_env: Mapping[str, str]) -> Device:
    """The device of the process at `local_rank` of `local_ranks` on its machine.

    `auto`: a GPU when the framework is built with CUDA and every local process can have one of
    its own (the launcher's choice, else GPU `local_rank`), else the CPU, for all of them alike
    (gloo and NCCL do not mix). `gpu` the same but a `DeviceError` naming the counts where a
    GPU is missing; `cpu` always the CPU."""
    if requested not in REQUESTS:
        raise DeviceError(f"--device must be one of {', '.join(REQUESTS)}, not {requested!r}")
    if requested == CPU:
        return Device(CPU, 0, "--device cpu")
    assigned = assigned_gpu(launcher_env)
    index = local_rank if assigned is None else assigned
    if not cuda_built:
        problem = "the framework is built without CUDA (a CPU-only build): it sees no GPU"
    elif assigned is None and local_ranks > visible_gpus:
        problem = (f"{plural(local_ranks, 'process')} on this machine need {plural(local_ranks, 'GPU')} but "
                   f"{plural(visible_gpus, 'GPU')} {'is' if visible_gpus == 1 else 'are'} visible")
    elif index >= visible_gpus:
        problem = (f"this process was given GPU {index} but {plural(visible_gpus, 'GPU')} "
                   f"{'is' if visible_gpus == 1 else 'are'} visible (indices 0-{max(0, visible_gpus - 1)})")
    else:
        source = f"{PADDLE_SELECTED}={assigned}" if assigned is not None else f"local rank {local_rank}"
        return Device(GPU, index, f"{source}, {plural(visible_gpus, 'GPU')} visible")
    if requested == GPU:
        raise DeviceError(f"--device gpu: {problem}; run with --device cpu, or on fewer processes per machine")
    return Device(CPU, 0, f"auto: {problem}")


def hints_of_gpus(patterns: tuple[str, ...] = GPU_NODES) -> bool:
    """True when a GPU driver's device node exists: only then can a framework see a GPU."""
    return any(glob.glob(p) for p in patterns)
