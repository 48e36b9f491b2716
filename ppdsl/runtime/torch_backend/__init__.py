"""The PyTorch adapter: with its `runtime/torch_backend/split.py`, the only place that imports
torch. See `ppdsl.runtime.framework` for what each method promises."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..jobs.devices import Device
from ..framework import TORCH, Framework, GradRefused, ShardedWeights, Spread
from . import fsdp, graph_split, split


class TorchFramework(Framework):
    name = TORCH
    layer_type = "torch.nn.Module"
    split = split
    tensor_type = "torch.Tensor"
    collective_modules = ("torch.distributed", "torch.distributed.distributed_c10d")
    collective_names = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce",
                        "reduce_scatter", "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "all_to_all",
                        "all_to_all_single", "barrier", "send", "recv", "isend", "irecv", "batch_isend_irecv")

    # --- tensors -------------------------------------------------------------------------
    def is_tensor(self, obj: Any) -> bool:
        return isinstance(obj, torch.Tensor)

    def needs_grad(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and t.requires_grad

    def leaf(self, t: Any, requires_grad: bool) -> Any:
        return t.detach().requires_grad_(requires_grad)

    def set_requires_grad(self, t: Any, flag: bool) -> None:
        t.requires_grad_(flag)

    def detach(self, t: Any) -> Any:
        return t.detach()

    def zeros_like(self, t: Any) -> Any:
        return torch.zeros_like(t)

    def empty(self, shape: Sequence[int], dtype: str) -> Any:
        return torch.empty(list(shape), dtype=getattr(torch, dtype), device=self._torch_device)

    def empty_like(self, t: Any) -> Any:
        return torch.empty_like(t, memory_format=torch.contiguous_format)

    def dtype_name(self, t: Any) -> str:
        return str(t.dtype).removeprefix("torch.")

    def chunk(self, t: Any, n: int) -> list[Any]:
        return list(t.split(t.shape[0] // n)) if n > 1 else [t]

    def concat(self, parts: Sequence[Any]) -> Any:
        return torch.cat(list(parts), dim=0)

    def flatten(self, tensors: Sequence[Any]) -> Any:
        return torch.cat([t.detach().reshape(-1) for t in tensors])

    def unflatten_into(self, flat: Any, tensors: Sequence[Any | None], scale: float) -> None:
        sizes = [int(t.numel()) if t is not None else 0 for t in tensors]
        with torch.no_grad():
            for t, piece in zip(tensors, (flat * scale if scale != 1.0 else flat).split(sizes)):
                if t is not None:
                    t.copy_(piece.view(t.shape))

    def from_numpy(self, array: Any) -> Any:
        t = torch.from_numpy(np.array(array, copy=True))
        return t if self._torch_device is None else t.to(self._torch_device)

    def to_numpy(self, t: Any) -> Any:
        return t.detach().cpu().numpy()

    def local(self, t: Any) -> Any:
        from torch.distributed._functional_collectives import AsyncCollectiveTensor
        from torch.distributed.tensor import DTensor

        if not isinstance(t, DTensor):
            return t
        part = t.to_local()
        # A redistribution's result is a functional collective still under way: torch's own ops
        # wait for it on first use, but a send or an all-reduce reads the memory directly.
        return part.wait() if isinstance(part, AsyncCollectiveTensor) else part

    def whole(self, t: Any) -> Any:
        from torch.distributed.tensor import DTensor

        return t.full_tensor() if isinstance(t, DTensor) else t

    def spread(self, t: Any) -> Spread | None:
        from torch.distributed.tensor import DTensor

        if not isinstance(t, DTensor):
            return None
        placements: list[list[Any]] = []
        for p in t.placements:
            if p.is_shard():
                placements.append(["S", int(p.dim)])
            elif p.is_replicate():
                placements.append(["R"])
            elif p.is_partial():
                placements.append(["P", str(p.reduce_op)])
            else:
                from ..interpreter.values import StageValueError

                raise StageValueError(f"a DTensor placed as {p} cannot be sent: only Shard, Replicate and Partial "
                                      "placements are rebuilt on arrival")
        return {"placements": placements, "shape": [int(d) for d in t.shape], "stride": [int(d) for d in t.stride()]}

    def mesh_of(self, layer: Any) -> Any | None:
        from torch.distributed.tensor import DTensor

        for p in layer.parameters():
            if isinstance(p, DTensor):
                return p.device_mesh
        return None

    def rewrap(self, local: Any, mesh: Any, spread: Spread) -> Any:
        from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

        placements = [Shard(p[1]) if p[0] == "S" else Replicate() if p[0] == "R" else Partial(p[1])
                      for p in spread["placements"]]
        return DTensor.from_local(local, mesh, placements, run_check=False, shape=torch.Size(spread["shape"]),
                                  stride=tuple(spread["stride"]))

    def numel(self, t: Any) -> int:
        return int(t.numel())

    # A DTensor (a sharded or split parameter, its gradient, its optimizer state) holds its
    # local part on this rank: that is its size and its buffer here.
    def nbytes(self, t: Any) -> int:
        t = self.local(t)
        return int(t.numel()) * int(t.element_size())

    def data_ptr(self, t: Any) -> int:
        return int(self.local(t).data_ptr())

    def storage_ptr(self, t: Any) -> int:
        return int(self.local(t).untyped_storage().data_ptr())

    # --- autograd ------------------------------------------------------------------------
    def backward(self, outputs: list[Any], grads: list[Any] | None) -> None:
        torch.autograd.backward(outputs, grads)

    def grad(self, outputs: list[Any], inputs: list[Any], grads: list[Any] | None) -> list[Any | None]:
        try:
            return list(torch.autograd.grad(outputs, inputs, grad_outputs=grads, retain_graph=True,
                                            allow_unused=True))
        except RuntimeError as exc:
            if "use_reentrant=True" in str(exc):  # torch.utils.checkpoint's own refusal
                raise GradRefused(str(exc)) from None
            raise

    def no_grad(self) -> AbstractContextManager[Any]:
        return torch.no_grad()  # type: ignore[no-any-return]

    def used_parameters(self, outputs: list[Any], params: Sequence[Any]) -> list[bool]:
        leaves: set[int] = set()
        seen: set[Any] = set()
        todo = [t.grad_fn for t in outputs if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        while todo:
            node = todo.pop()
            if node in seen:
                continue
            seen.add(node)
            variable = getattr(node, "variable", None)  # an AccumulateGrad: a leaf
            if variable is not None:
                leaves.add(id(variable))
            todo.extend(n for n, _ in node.next_functions if n is not None)
        return [id(p) in leaves for p in params]

    # --- layers --------------------------------------------------------------------------
    def is_layer(self, obj: Any) -> bool:
        return isinstance(obj, torch.nn.Module)

    def mlp(self, weights: list[Any], biases: list[Any], tanh: list[bool]) -> Any:
        layers: list[torch.nn.Module] = []
        for w, b, act in zip(weights, biases, tanh):
            linear = torch.nn.Linear(w.shape[0], w.shape[1], dtype=getattr(torch, str(w.dtype)))
            with torch.no_grad():  # torch keeps weights as [out, in]
                linear.weight.copy_(torch.from_numpy(np.ascontiguousarray(w.T)))
                linear.bias.copy_(torch.from_numpy(np.array(b, copy=True)))
            layers.append(linear)
            if act:
                layers.append(torch.nn.Tanh())
        return self.to_device(torch.nn.Sequential(*layers))

    def seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def sublayers(self, layer: Any) -> Iterator[tuple[str, Any]]:
        return iter(layer.named_modules())

    def linear_class(self) -> Any:
        return torch.nn.Linear

    def graph_weights(self, stage: Any, switched: Sequence[Any]) -> list[tuple[str, Any, str]]:
        return split.graph_weights(stage, switched)

    def rng_state(self) -> Any:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        return torch.get_rng_state(), cuda

    def set_rng_state(self, state: Any) -> None:
        cpu, cuda = state
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)

    def running_statistics(self, layer: Any) -> list[str]:
        norms = torch.nn.modules.batchnorm._NormBase
        return [name or "(the stage itself)" for name, m in layer.named_modules()
                if isinstance(m, norms) and m.training and m.track_running_stats]

    def packing(self, pack: Callable[[Any], Any], unpack: Callable[[Any], Any]) -> AbstractContextManager[Any]:
        hooks: AbstractContextManager[Any] = torch.autograd.graph.saved_tensors_hooks(pack, unpack)
        return hooks

    def reshape(self, t: Any, shape: list[int]) -> Any:
        return t.view(shape)

    def to_host(self, t: Any) -> Any:
        return t.detach().to("cpu", copy=True)

    def from_host(self, t: Any) -> Any:
        return t.to(self._torch_device or "cpu", copy=True)

    def hooks_registered(self) -> AbstractContextManager[list[str]]:
        return graph_split.hooks_registered()

    def backward_split(self, outs: list[Any], grads: list[Any] | None, inputs: list[Any], eager: list[Any],
                       deferred: list[Any]) -> tuple[list[Any | None], Callable[[], int] | None]:
        return graph_split.backward_input(outs, grads, inputs, eager, deferred)

    def make_optimizer(self, name: str, lr: float, parameters: list[Any]) -> Any:
        if name == "momentum":  # Paddle's Momentum: heavy ball, 0.9
            return torch.optim.SGD(parameters, lr=lr, momentum=0.9)
        table: dict[str, Any] = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
        return table[name](parameters, lr=lr)

    def clear_grads(self, optimizer: Any) -> None:
        optimizer.zero_grad(set_to_none=False)

    def optimizer_step(self, optimizer: Any) -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)

    def set_threads(self, n: int) -> None:
        torch.set_num_threads(n)

    def allocator_peak_bytes(self) -> int | None:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None
        return int(torch.cuda.max_memory_allocated())

    def saving(self, pack: Callable[[Any], None]) -> AbstractContextManager[Any]:
        def keep(t: Any) -> Any:
            pack(t)
            return t

        hooks: AbstractContextManager[Any] = torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t)
        return hooks

    def optimizer_state_bytes(self, optimizer: Any, parameters: Sequence[Any]) -> int:
        state = optimizer.state
        return sum(self.nbytes(t) for p in parameters for t in state.get(p, {}).values() if torch.is_tensor(t))

    # --- devices -------------------------------------------------------------------------
    #: The bound torch device; None on the CPU, so CPU tensors are made as before.
    _torch_device: Any = None

    def cuda_built(self) -> bool:
        return torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None

    def device_count(self) -> int:
        return int(torch.cuda.device_count()) if self.cuda_built() else 0

    def set_device(self, device: Device) -> None:
        if device.is_gpu:
            torch.cuda.set_device(device.index)
            self._torch_device = torch.device("cuda", device.index)
        else:
            self._torch_device = None
        self.device = device

    def to_device(self, obj: Any) -> Any:
        return obj.to(self._torch_device) if self._torch_device is not None else obj

    def is_on_gpu(self, t: Any) -> bool:
        return bool(t.is_cuda)

    def synchronize(self) -> None:
        if self._torch_device is not None:
            torch.cuda.synchronize(self._torch_device)

    # --- the process group ---------------------------------------------------------------
    def init_process_group(self) -> None:
        dist.init_process_group(backend=self.default_backend())

    def destroy_process_group(self) -> None:
        # Without it, gloo's worker threads meet the interpreter's teardown: "terminate called
        # without an active exception" (SIGABRT) after a run that finished well.
        if self.is_initialized():
            dist.destroy_process_group()

    def open_store(self, seconds: float) -> Any:
        from datetime import timedelta

        # env:// rendezvous: rank 0's store, or torchrun's agent's (TORCHELASTIC_USE_AGENT_STORE).
        return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                             timeout=timedelta(seconds=seconds), wait_for_workers=False)

    def job_store(self) -> Any:
        if not self.is_initialized():
            return None
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()

    def is_initialized(self) -> bool:
        return bool(dist.is_available() and dist.is_initialized())

    def rank(self) -> int:
        return int(dist.get_rank()) if self.is_initialized() else 0

    def world_size(self) -> int:
        return int(dist.get_world_size()) if self.is_initialized() else 1

    def backend(self) -> str:
        return str(dist.get_backend()).lower()

    def default_backend(self) -> str:
        # gloo moves CPU tensors, NCCL GPU ones; PPDSL_TORCH_BACKEND names another.
        return os.environ.get("PPDSL_TORCH_BACKEND", self.device.backend).lower()

    def all_gather_object(self, obj: Any) -> list[Any]:
        gathered: list[Any] = [None] * self.world_size()
        dist.all_gather_object(gathered, obj)
        return gathered

    def barrier(self) -> None:
        dist.barrier()

    def new_group(self, ranks: list[int]) -> Any:
        return dist.new_group(ranks)

    def all_reduce(self, tensor: Any, group: Any) -> None:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)

    def link(self, group: Any, rank: int, peer: int) -> tuple[Callable[[Any], None], Callable[[Any], None]]:
        def send(t: Any) -> None:
            # gloo sends only contiguous memory; a stage's output may be a view (an `expand`,
            # a `transpose`). `contiguous()` is the tensor itself when it already is.
            dist.send(t.contiguous(), dst=peer, group=group)

        def recv(t: Any) -> None:
            dist.recv(t, src=peer, group=group)

        return send, recv

    sharding_refused = None

    def sharded(self, layer: Any) -> ShardedWeights | None:
        return fsdp.sharded_stage(layer)

    def shard_stages(self, layers: dict[int, Any], copies: int, shards: int, pipeline: int,
                     reshard_after_forward: bool) -> None:
        fsdp.shard_layers(layers, copies, shards, pipeline, reshard_after_forward)

    tensor_parallel_refused = None

    def split_stages(self, layers: dict[int, Any], replicas: int, pipeline: int, tensor: int,
                     parallelize: Callable[[Any, Any], None] | None) -> None:
        from . import tensor_parallel

        tensor_parallel.split_layers(layers, replicas, pipeline, tensor, parallelize)

    def is_split(self, t: Any) -> bool:
        from torch.distributed.tensor import DTensor

        return isinstance(t, DTensor) and any(p.is_shard() for p in t.placements)

    def batch(self, ops: Sequence[tuple[bool, Any, int, Any]]) -> None:
        # Received into buffers from `empty_like` (contiguous); sent as `send` above sends.
        p2p = [dist.P2POp(dist.isend, t.contiguous(), peer, group) if is_send else dist.P2POp(dist.irecv, t, peer, group)
               for is_send, t, peer, group in ops]
        for work in dist.batch_isend_irecv(p2p):
            work.wait()


ADAPTER = TorchFramework
