"""The Paddle adapter: with its helpers (`runtime/paddle_backend/blas.py`,
`runtime/paddle_backend/split.py`, and `runtime/paddle_backend/rendezvous.py`, which needs no
paddle), the one place that imports paddle. See `ppdsl.runtime.framework` for what each method
promises."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import paddle
import paddle.distributed as dist

from ..jobs.devices import PADDLE_SELECTED, Device
from ..framework import PADDLE, PADDLE_SHARDING_REFUSED, PADDLE_TENSOR_PARALLEL_REFUSED, Framework, GradRefused
from . import rendezvous, split


class PaddleFramework(Framework):
    name = PADDLE
    sharding_refused = PADDLE_SHARDING_REFUSED
    tensor_parallel_refused = PADDLE_TENSOR_PARALLEL_REFUSED
    layer_type = "paddle.nn.Layer"
    split = split
    tensor_type = "paddle.Tensor"
    collective_modules = ("paddle.distributed",)
    collective_names = ("all_reduce", "all_gather", "all_gather_object", "reduce", "reduce_scatter", "broadcast",
                        "broadcast_object_list", "alltoall", "alltoall_single", "barrier", "send", "recv", "isend",
                        "irecv", "batch_isend_irecv")

    # --- tensors -------------------------------------------------------------------------
    def is_tensor(self, obj: Any) -> bool:
        return isinstance(obj, paddle.Tensor)

    def needs_grad(self, t: Any) -> bool:
        return isinstance(t, paddle.Tensor) and not t.stop_gradient

    def leaf(self, t: Any, requires_grad: bool) -> Any:
        out = t.detach()
        out.stop_gradient = not requires_grad
        return out

    def set_requires_grad(self, t: Any, flag: bool) -> None:
        t.stop_gradient = not flag

    def detach(self, t: Any) -> Any:
        return t.detach()

    def zeros_like(self, t: Any) -> Any:
        return paddle.zeros_like(t)

    def empty(self, shape: Sequence[int], dtype: str) -> Any:
        return paddle.empty(list(shape), dtype=dtype)

    def empty_like(self, t: Any) -> Any:
        return paddle.empty(t.shape, dtype=t.dtype)

    def dtype_name(self, t: Any) -> str:
        return str(t.dtype).removeprefix("paddle.")

    def chunk(self, t: Any, n: int) -> list[Any]:
        return list(paddle.split(t, n, axis=0)) if n > 1 else [t]

    def concat(self, parts: Sequence[Any]) -> Any:
        return paddle.concat(list(parts), axis=0)

    def flatten(self, tensors: Sequence[Any]) -> Any:
        return paddle.concat([t.reshape([-1]) for t in tensors])

    def unflatten_into(self, flat: Any, tensors: Sequence[Any | None], scale: float) -> None:
        sizes = [int(t.size) if t is not None else 0 for t in tensors]
        with paddle.no_grad():
            scaled = flat * scale if scale != 1.0 else flat  # an exact copy of any dtype at 1
            for t, piece in zip(tensors, paddle.split(scaled, sizes) if len(sizes) > 1 else [scaled]):
                if t is not None:
                    paddle.assign(piece.reshape(t.shape), output=t)

    def from_numpy(self, array: Any) -> Any:
        return paddle.to_tensor(array)

    def to_numpy(self, t: Any) -> Any:
        return t.numpy()

    def numel(self, t: Any) -> int:
        return int(t.size)

    def nbytes(self, t: Any) -> int:
        n = 1
        for d in t.shape:  # `t.size` costs 10 us, ~15x this
            n *= d
        return n * int(t.element_size())

    def data_ptr(self, t: Any) -> int:
        return int(t.data_ptr())

    # --- autograd ------------------------------------------------------------------------
    def backward(self, outputs: list[Any], grads: list[Any] | None) -> None:
        paddle.autograd.backward(outputs, grads)

    def grad(self, outputs: list[Any], inputs: list[Any], grads: list[Any] | None) -> list[Any | None]:
        # Paddle's reentrant recompute runs a whole backward inside its node, into the
        # parameters' `.grad`, whatever `paddle.grad` was asked: a later backward would add
        # those gradients twice.
        if any(node.name() == _REENTRANT_RECOMPUTE for node in _graph(outputs)):
            raise GradRefused("a reentrant recompute (fleet.utils.recompute(..., use_reentrant=True)) accumulates "
                              "its parameters' gradients inside any backward through it")
        return list(paddle.grad(outputs, inputs, grad_outputs=grads, retain_graph=True, allow_unused=True))

    def no_grad(self) -> AbstractContextManager[Any]:
        return paddle.no_grad()  # type: ignore[no-any-return]

    def used_parameters(self, outputs: list[Any], params: Sequence[Any]) -> list[bool]:
        # Paddle's accumulation nodes do not name their tensor; a leaf's own `grad_fn` is
        # that node, so the two are matched by the node's address.
        leaves = {node.node_ptr() for node in _graph(outputs) if node.name() == "GradNodeAccumulation"}
        return [p.grad_fn is not None and p.grad_fn.node_ptr() in leaves for p in params]

    # --- layers --------------------------------------------------------------------------
    def is_layer(self, obj: Any) -> bool:
        return isinstance(obj, paddle.nn.Layer)

    def mlp(self, weights: list[Any], biases: list[Any], tanh: list[bool]) -> Any:
        layers: list[Any] = []
        saved = paddle.get_default_dtype()
        paddle.set_default_dtype(str(weights[0].dtype))  # parameters are made in the default dtype
        try:
            for w, b, act in zip(weights, biases, tanh):
                linear = paddle.nn.Linear(w.shape[0], w.shape[1])
                linear.weight.set_value(w)  # Paddle keeps weights as [in, out]
                linear.bias.set_value(b)
                layers.append(linear)
                if act:
                    layers.append(paddle.nn.Tanh())
        finally:
            paddle.set_default_dtype(saved)
        return paddle.nn.Sequential(*layers)

    def seed(self, seed: int) -> None:
        paddle.seed(seed)

    def sublayers(self, layer: Any) -> Iterator[tuple[str, Any]]:
        return iter(layer.named_sublayers(include_self=True))

    def packing(self, pack: Callable[[Any], Any], unpack: Callable[[Any], Any]) -> AbstractContextManager[Any]:
        return paddle.autograd.saved_tensors_hooks(pack, unpack)  # type: ignore[no-any-return]

    def reshape(self, t: Any, shape: list[int]) -> Any:
        return paddle.reshape(t, shape)

    def to_host(self, t: Any) -> Any:
        return t.detach().cpu() if self.device.is_gpu else t.detach().clone()

    def from_host(self, t: Any) -> Any:
        return t.cuda() if self.device.is_gpu else t.clone()

    def rng_state(self) -> Any:
        return paddle.get_rng_state()

    def set_rng_state(self, state: Any) -> None:
        paddle.set_rng_state(state)

    def running_statistics(self, layer: Any) -> list[str]:
        norms = paddle.nn.layer.norm._BatchNormBase
        return [name or "(the stage itself)" for name, m in layer.named_sublayers(include_self=True)
                if isinstance(m, norms) and m.training and not m._use_global_stats]

    def split_embeddings(self, stage: Any) -> list[tuple[str, Any]]:
        return split.embeddings(stage)

    def linear_class(self) -> Any:
        return paddle.nn.Linear

    def make_optimizer(self, name: str, lr: float, parameters: list[Any]) -> Any:
        table = {"sgd": paddle.optimizer.SGD, "momentum": paddle.optimizer.Momentum,
                 "adam": paddle.optimizer.Adam, "adamw": paddle.optimizer.AdamW}
        return table[name](learning_rate=lr, parameters=parameters)

    def clear_grads(self, optimizer: Any) -> None:
        optimizer.clear_grad(set_to_zero=False)

    def optimizer_step(self, optimizer: Any) -> None:
        optimizer.step()
        optimizer.clear_grad(set_to_zero=False)

    def set_threads(self, n: int) -> None:
        paddle.base.core.set_num_threads(n)

    def allocator_peak_bytes(self) -> int | None:
        if not paddle.device.is_compiled_with_cuda() or paddle.device.cuda.device_count() == 0:
            return None
        return int(paddle.device.cuda.max_memory_allocated())

    def saving(self, pack: Callable[[Any], None]) -> AbstractContextManager[Any]:
        def keep(t: Any) -> Any:
            pack(t)
            return t

        return paddle.autograd.saved_tensors_hooks(keep, lambda t: t)  # type: ignore[no-any-return]

    def optimizer_state_bytes(self, optimizer: Any, parameters: Sequence[Any]) -> int:
        names = {p.name for p in parameters}
        # Paddle keeps each kind of state (moment1, velocity, ...) as a dict by parameter name.
        tables = list(getattr(optimizer, "_accumulators", {}).values())
        tables.append(getattr(optimizer, "_master_weights", {}))
        return sum(self.nbytes(t) for table in tables for name, t in table.items() if name in names)

    # --- devices -------------------------------------------------------------------------
    def cuda_built(self) -> bool:
        return bool(paddle.device.is_compiled_with_cuda())

    def device_count(self) -> int:
        return int(paddle.device.cuda.device_count()) if self.cuda_built() else 0

    def set_device(self, device: Device) -> None:
        if device.is_gpu:
            # `init_parallel_env` sets the expected place from this variable (CPU under gloo):
            # written here, NCCL's place and the one set below are the same GPU.
            os.environ.setdefault(PADDLE_SELECTED, str(device.index))
        else:
            # A CUDA build's `init_parallel_env` picks NCCL unless told: CPU tensors need gloo.
            os.environ.setdefault("PADDLE_DISTRI_BACKEND", device.backend)
        paddle.set_device(device.name)
        self.device = device

    def to_device(self, obj: Any) -> Any:
        if not self.device.is_gpu:
            return obj
        if isinstance(obj, paddle.Tensor):
            return obj.cuda(self.device.index)
        obj.to(device=self.device.name)  # a Layer moves in place
        return obj

    def is_on_gpu(self, t: Any) -> bool:
        return bool(t.place.is_gpu_place())

    def synchronize(self) -> None:
        if self.device.is_gpu:
            paddle.device.synchronize()

    # --- the process group ---------------------------------------------------------------
    def init_process_group(self) -> None:
        rendezvous.wait_for_store()
        dist.init_parallel_env()

    def destroy_process_group(self) -> None:
        pass  # Paddle's groups end with the process; its launcher's runs exit cleanly without a teardown call

    def open_store(self, seconds: float) -> Any:
        from paddle.base import core

        where = rendezvous.store_endpoint(os.environ)
        if where is None:
            return None
        # No workers to wait for (0): a client that only connects. Its calls have no timeout of
        # their own; a connection to a store that is gone is retried without end.
        return core.TCPStore(where[0], where[1], False, 0, max(1, int(seconds)))

    def job_store(self) -> Any:
        if not self.is_initialized():
            return None
        from paddle.base import core

        where = rendezvous.store_endpoint(os.environ)
        if where is None:
            return core.create_or_get_global_tcp_store()
        # A connection of the notes' own, without Nagle's delay (`rendezvous.no_delay`).
        before = rendezvous.sockets()
        store = core.TCPStore(where[0], where[1], False, 0, 900)
        rendezvous.no_delay(rendezvous.opened_since(before), where[1])
        return store

    def is_initialized(self) -> bool:
        return bool(dist.is_initialized())

    def rank(self) -> int:
        return int(dist.get_rank())

    def world_size(self) -> int:
        return int(dist.get_world_size())

    def backend(self) -> str:
        return str(dist.get_backend()).lower()

    def default_backend(self) -> str:
        name = os.environ.get("PADDLE_DISTRI_BACKEND")
        return name.lower() if name else self.device.backend

    def all_gather_object(self, obj: Any) -> list[Any]:
        gathered: list[Any] = []
        dist.all_gather_object(gathered, obj)
        return gathered

    def barrier(self) -> None:
        dist.barrier()

    def new_group(self, ranks: list[int]) -> Any:
        return dist.new_group(ranks)

    def all_reduce(self, tensor: Any, group: Any) -> None:
        # The process group's own call: `dist.all_reduce` goes through Python that consults
        # the dygraph tracer, which a background thread does not have.
        group.process_group.all_reduce(tensor, paddle.base.core.ReduceOp.SUM, True).wait()

    def link(self, group: Any, rank: int, peer: int) -> tuple[Callable[[Any], None], Callable[[Any], None]]:
        # The process group's own calls: `dist.send` would look the peer up again each time.
        pg, idx = group.process_group, group.get_group_rank(peer)

        def send(t: Any) -> None:
            pg.send(t, idx, True).wait()

        def recv(t: Any) -> None:
            pg.recv(t, idx, True).wait()

        return send, recv

    def batch(self, ops: Sequence[tuple[bool, Any, int, Any]]) -> None:
        p2p = [dist.P2POp(dist.isend if is_send else dist.irecv, t, peer, group) for is_send, t, peer, group in ops]
        for task in dist.batch_isend_irecv(p2p):
            task.wait()


_REENTRANT_RECOMPUTE = "GradNodePyLayer_RecomputeFunction"


def _graph(outputs: list[Any]) -> Iterator[Any]:
    """Every node of the autograd graph behind `outputs`, once each."""
    seen: set[int] = set()
    todo = [t.grad_fn for t in outputs if isinstance(t, paddle.Tensor) and t.grad_fn is not None]
    while todo:
        node = todo.pop()
        ptr = node.node_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        yield node
        todo.extend(n for n in node.next_functions if n is not None)


ADAPTER = PaddleFramework
