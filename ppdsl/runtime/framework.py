"""What the interpreter asks of a deep-learning framework: one small adapter per framework.

The interpreter (`schedule.py`), the transport (`comm.py`), stage values (`values.py`), the
live-memory count, `--verify` and the worker are written once against this interface; the
Paddle adapter (`paddle_backend/`) and the PyTorch adapter (`torch_backend/`) are the only
modules that import their framework. An adapter is made by `get_framework(name)`, which
imports the framework on first use, so choosing one costs nothing until a run needs it.
"""

from __future__ import annotations

import abc
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Protocol

from ..diagnostics import UsageError
from .jobs.devices import CPU_DEVICE, Device

PADDLE, TORCH = "paddle", "torch"
FRAMEWORKS = (PADDLE, TORCH)
_MODULES = {PADDLE: "ppdsl.runtime.paddle_backend", TORCH: "ppdsl.runtime.torch_backend"}
_INSTALL = {PADDLE: "pip install 'ppdsl[paddle]' (CPU), or paddlepaddle-gpu from Paddle's own index",
            TORCH: "pip install 'ppdsl[torch]' (or torch from pytorch.org for your CUDA)"}

# Paddle's sharding (`paddle.distributed.sharding.group_sharded_parallel`) asserts that it runs
# on a GPU, an XPU or a custom device: not on the CPU build ppdsl runs and tests Paddle on.
# fleet's tensor-parallel layers need `fleet.init` with a hybrid strategy, which fails on the CPU
# build with gloo while it creates its groups (docs/runtime.md, data parallelism).
PADDLE_TENSOR_PARALLEL_REFUSED = ("--tp splits stages with PyTorch's tensor parallelism only: Paddle's tensor-parallel "
                                  "layers need fleet.init with a hybrid strategy, which fails on Paddle's CPU build; "
                                  "run with --framework torch")
PADDLE_SHARDING_REFUSED = ("--fsdp shards stages with PyTorch's FSDP2 only: Paddle's sharding (group_sharded_parallel) "
                           "runs on GPU, XPU and custom devices, not on Paddle's CPU build; run with --framework torch")


# A message member's layout over a mesh of ranks, as its note carries it (JSON):
# {"placements": [["S", dim] | ["R"] | ["P", reduce op], ...], "shape": [...], "stride": [...]}
# (the whole tensor's shape and stride).
Spread = dict[str, Any]


class GradRefused(RuntimeError):
    """The graph cannot give the gradients of some of its leaves alone (torch's reentrant
    checkpoint refuses `.grad()`): only a whole backward runs on it."""


class SplitRefused(RuntimeError):
    """The autograd graph of a backward cannot be split exactly between `I` and `W` (the
    message says why): the whole backward runs in `I`."""


class SplitCostly(Exception):
    """Some deferred weights are made by backward nodes that compute their input and weight
    gradients together (`nodes`): deferring them would compute the input gradient twice, so
    they are better finished in `I`."""

    def __init__(self, weights: list[Any], nodes: list[str]):
        super().__init__(", ".join(nodes))
        self.weights = weights
        self.nodes = nodes


class CollectiveRefused(RuntimeError):
    """A collective called where it has no peers (the message says where and what to do)."""


class ShardedWeights(Protocol):
    """A stage whose weights are sharded over a group of ranks (FSDP), as the schedule's
    `UNSHARD`, `RESHARD` and `REDUCE_GRAD` drive it."""

    def begin_step(self, resharded_by_schedule: bool) -> None:
        """Before a step's first action: gradients accumulate unsharded until `reduce`."""

    def gather(self) -> None:
        """Start gathering the whole weights (the stage's next compute waits for them)."""

    def wait(self) -> None:
        """Wait for a gather started by `gather`."""

    def free(self) -> None:
        """Free the gathered weights, keeping this rank's shard."""

    def reduce(self) -> None:
        """Reduce the step's gradients over the group, each rank keeping its shard's."""

    def gathered_now(self) -> tuple[int, set[int]]:
        """The bytes of the whole weights gathered now, and their buffers' addresses
        (`Framework.storage_ptr`: what autograd saves of them is weights, not activations)."""
        return 0, set()


class Framework(abc.ABC):
    """Tensors, autograd, collectives and point-to-point messages of one framework."""

    name: str
    #: What a stage must be, as a user would write it (`paddle.nn.Layer`).
    layer_type: str
    #: What a tensor is, as a user would write it (`paddle.Tensor`).
    tensor_type: str
    #: Where new tensors and stages go (`set_device`); the CPU until a run binds a GPU.
    device: Device = CPU_DEVICE

    # --- tensors -------------------------------------------------------------------------
    @abc.abstractmethod
    def is_tensor(self, obj: Any) -> bool: ...

    @abc.abstractmethod
    def needs_grad(self, t: Any) -> bool:
        """True for a tensor that takes part in autograd (Paddle: `not stop_gradient`)."""

    @abc.abstractmethod
    def leaf(self, t: Any, requires_grad: bool) -> Any:
        """A detached tensor sharing `t`'s buffer, a new autograd leaf when `requires_grad`."""

    @abc.abstractmethod
    def set_requires_grad(self, t: Any, flag: bool) -> None: ...

    @abc.abstractmethod
    def detach(self, t: Any) -> Any: ...

    @abc.abstractmethod
    def zeros_like(self, t: Any) -> Any: ...

    @abc.abstractmethod
    def empty(self, shape: Sequence[int], dtype: str) -> Any:
        """An uninitialised buffer; `dtype` is one of `messages.DTYPES`."""

    @abc.abstractmethod
    def empty_like(self, t: Any) -> Any: ...

    @abc.abstractmethod
    def dtype_name(self, t: Any) -> str:
        """`float32`, `int64`, ... (the names of `messages.DTYPES`)."""

    def shape(self, t: Any) -> list[int]:
        return [int(d) for d in t.shape]

    @abc.abstractmethod
    def chunk(self, t: Any, n: int) -> list[Any]:
        """`t` split along dimension 0 into `n` equal parts (the caller checked they are)."""

    @abc.abstractmethod
    def concat(self, parts: Sequence[Any]) -> Any:
        """Tensors joined along dimension 0."""

    @abc.abstractmethod
    def flatten(self, tensors: Sequence[Any]) -> Any:
        """One new 1-D tensor holding copies of `tensors` (one dtype) end to end."""

    @abc.abstractmethod
    def unflatten_into(self, flat: Any, tensors: Sequence[Any | None], scale: float) -> None:
        """Copy `flat`'s consecutive pieces, times `scale`, into `tensors` in place (the
        inverse of `flatten`); a None keeps its place in `flat` and receives nothing. At a
        `scale` of 1 the copy is exact, whatever the dtype (an integer header)."""

    @abc.abstractmethod
    def from_numpy(self, array: Any) -> Any:
        """A tensor holding a copy of a numpy array, same dtype."""

    @abc.abstractmethod
    def to_numpy(self, t: Any) -> Any: ...

    def local(self, t: Any) -> Any:
        """This rank's part of `t` where it is sharded over ranks (its storage); else `t`."""
        return t

    def whole(self, t: Any) -> Any:
        """`t` whole where it is sharded over ranks (a collective over its group, which every
        member calls in the same order); else `t`."""
        return t

    def spread(self, t: Any) -> Spread | None:
        """How `t` is laid out over a mesh of ranks, as a message's note can carry it (a
        DTensor: its placements and whole shape); None for a plain tensor. Raises
        StageValueError for a layout a message cannot carry."""
        return None

    def mesh_of(self, layer: Any) -> Any | None:
        """The mesh `layer`'s parameters are laid out over (its tensor-parallel group), or None."""
        return None

    def rewrap(self, local: Any, mesh: Any, spread: Spread) -> Any:
        """`local` (this rank's part) as the tensor laid out over `mesh` as `spread` says."""
        from .interpreter.values import StageValueError

        raise StageValueError(f"a tensor laid out over a mesh of ranks arrived, which {self.name} cannot rebuild")

    @abc.abstractmethod
    def numel(self, t: Any) -> int: ...

    @abc.abstractmethod
    def nbytes(self, t: Any) -> int: ...

    @abc.abstractmethod
    def data_ptr(self, t: Any) -> int: ...

    def storage_ptr(self, t: Any) -> int:
        """The address of the buffer `t` is a view into (a view at an offset has another
        `data_ptr`)."""
        return self.data_ptr(t)

    # --- autograd ------------------------------------------------------------------------
    @abc.abstractmethod
    def backward(self, outputs: list[Any], grads: list[Any] | None) -> None:
        """Accumulate into `.grad` of every leaf the outputs depend on; frees the graph."""

    @abc.abstractmethod
    def grad(self, outputs: list[Any], inputs: list[Any], grads: list[Any] | None) -> list[Any | None]:
        """Gradients of `outputs` w.r.t. `inputs`, the graph kept, unused inputs None;
        `GradRefused` where the graph allows only a whole backward."""

    def grad_of(self, t: Any) -> Any | None:
        """The accumulated `.grad` of a leaf or parameter (None before any backward)."""
        return t.grad

    @abc.abstractmethod
    def no_grad(self) -> AbstractContextManager[Any]: ...

    @abc.abstractmethod
    def used_parameters(self, outputs: list[Any], params: Sequence[Any]) -> list[bool]:
        """For each of `params`, whether the autograd graph of `outputs` reaches it."""

    # --- layers --------------------------------------------------------------------------
    @abc.abstractmethod
    def is_layer(self, obj: Any) -> bool: ...

    def named_parameters(self, layer: Any) -> Iterator[tuple[str, Any]]:
        return iter(layer.named_parameters())

    def trainable(self, layer: Any) -> list[Any]:
        """The parameters of `layer` that get gradients."""
        return [p for _, p in self.named_parameters(layer) if self.needs_grad(p)]

    @abc.abstractmethod
    def mlp(self, weights: list[Any], biases: list[Any], tanh: list[bool]) -> Any:
        """A Sequential of Linear layers holding these numpy arrays (weights [in, out]),
        each followed by a Tanh where `tanh` says: the built-in model."""

    @abc.abstractmethod
    def seed(self, seed: int) -> None:
        """The framework's global generator, for the initial weights of a stage."""

    @abc.abstractmethod
    def sublayers(self, layer: Any) -> Iterator[tuple[str, Any]]:
        """(name, layer) for `layer` itself (name "") and everything inside it."""

    @abc.abstractmethod
    def linear_class(self) -> Any:
        """The framework's Linear, whose weight gradient the split backward defers."""

    #: The adapter's split-backward module: `split_forward(linear, store)` and
    #: `accumulate_weight_grad(weight, x, dy)`.
    split: Any

    def split_forward(self, linear: Any, store: Any) -> Callable[[Any], Any]:
        """A forward for `linear` whose backward defers its weight gradient to `store`."""
        return self.split.split_forward(linear, store)  # type: ignore[no-any-return]

    def unsplittable(self, stage: Any, name: str, linear: Any) -> str:
        """Why the Linear `linear` (named `name` inside `stage`) keeps the framework's own
        backward (its gradient must be whole when `I` ends), or "" when it may be switched."""
        return self.split.unsplittable(stage, name, linear)  # type: ignore[no-any-return]

    def accumulate_weight_grad(self, weight: Any, x: Any, dy: Any) -> None:
        """`weight.grad += ` the weight gradient of `y = linear(x, weight)` given `dy`."""
        self.split.accumulate_weight_grad(weight, x, dy)

    def split_embeddings(self, stage: Any) -> list[tuple[str, Any]]:
        """(name, layer) of the embeddings of `stage` whose weight gradients a split layer of
        the adapter's own defers to `W` (as the split Linear does); [] where none does."""
        return []

    def graph_weights(self, stage: Any, switched: Sequence[Any]) -> list[tuple[str, Any, str]]:
        """(name, parameter, its layer's class name) for each weight of `stage` whose gradient
        the split on the autograd graph defers to `W` (`switched`: the split Linears, which
        defer their own way); [] where the framework's graph cannot be split."""
        return []

    @abc.abstractmethod
    def rng_state(self) -> Any:
        """The random generators' state (what a dropout draws from), for `set_rng_state`."""

    @abc.abstractmethod
    def set_rng_state(self, state: Any) -> None: ...

    @abc.abstractmethod
    def running_statistics(self, layer: Any) -> list[str]:
        """The sublayers of `layer` that update running statistics in a training forward (a
        batch norm): a forward run twice (`R`) would update them twice."""

    @abc.abstractmethod
    def packing(self, pack: Callable[[Any], Any], unpack: Callable[[Any], Any]) -> AbstractContextManager[Any]:
        """While open, what autograd saves for a backward goes through `pack` and comes back
        through `unpack` (saved-tensor hooks)."""

    def is_contiguous(self, t: Any) -> bool:
        """Whether `t` is its buffer in row-major order: a reshape of it is the same bytes."""
        return bool(t.is_contiguous())

    @abc.abstractmethod
    def reshape(self, t: Any, shape: list[int]) -> Any:
        """Contiguous `t` seen with `shape` (as many elements): a view of the same buffer."""

    @abc.abstractmethod
    def to_host(self, t: Any) -> Any:
        """A copy of `t` in host memory (on the CPU: a new buffer all the same)."""

    @abc.abstractmethod
    def from_host(self, t: Any) -> Any:
        """A copy of host tensor `t` on the bound device (on the CPU: a new buffer)."""

    #: The framework's collective and point-to-point calls a user's code may make, by module.
    collective_modules: tuple[str, ...] = ()
    collective_names: tuple[str, ...] = ()

    @contextmanager
    def collectives_refused(self, why: Callable[[str], str]) -> Iterator[None]:
        """While open, the framework's collectives and messages (`collective_names` in each
        of `collective_modules`) raise `CollectiveRefused(why(name))` instead of running."""
        saved: list[tuple[Any, str, Any]] = []
        for module_name in self.collective_modules:
            module = sys.modules.get(module_name)
            if module is None:
                continue
            for name in self.collective_names:
                fn = getattr(module, name, None)
                if fn is None:
                    continue

                def refused(*args: Any, _name: str = name, **kwargs: Any) -> Any:
                    raise CollectiveRefused(why(_name))

                saved.append((module, name, fn))
                setattr(module, name, refused)
        try:
            yield
        finally:
            for module, name, fn in reversed(saved):
                setattr(module, name, fn)

    def hooks_registered(self) -> AbstractContextManager[list[str]]:
        """While open, collects the kinds of hooks the code puts on activations (the graph
        split refuses a forward that adds one)."""
        return nullcontext([])

    def backward_split(self, outs: list[Any], grads: list[Any] | None, inputs: list[Any], eager: list[Any],
                       deferred: list[Any]) -> tuple[list[Any | None], Callable[[], int] | None]:
        """`I` on the autograd graph: the gradients of `inputs` (returned) and of `eager` (in
        their `.grad`) now; those of `deferred` by the returned call (None: nothing deferred),
        which says how many weights it reached. `SplitRefused` before any work when the split
        would not be exact; `SplitCostly` before any work when some weights are not worth it."""
        raise SplitRefused(f"{self.name} has no split on its autograd graph")

    @abc.abstractmethod
    def make_optimizer(self, name: str, lr: float, parameters: list[Any]) -> Any:
        """One of `models.OPTIMIZERS` over `parameters`."""

    @abc.abstractmethod
    def clear_grads(self, optimizer: Any) -> None:
        """Zero the gradients of the optimizer's parameters without a step (a skipped step)."""

    @abc.abstractmethod
    def optimizer_step(self, optimizer: Any) -> None:
        """Step, then zero the gradients (keeping their buffers)."""

    @abc.abstractmethod
    def set_threads(self, n: int) -> None: ...

    @abc.abstractmethod
    def allocator_peak_bytes(self) -> int | None:
        """The accelerator allocator's peak, when one is in use (None on CPU)."""

    @abc.abstractmethod
    def saving(self, pack: Callable[[Any], None]) -> AbstractContextManager[Any]:
        """A context in which `pack(t)` sees every tensor autograd saves for a backward
        (`--profile` counts the bytes a forward keeps alive; the tensors are kept as they are)."""

    @abc.abstractmethod
    def optimizer_state_bytes(self, optimizer: Any, parameters: Sequence[Any]) -> int:
        """Bytes of the state `optimizer` keeps for `parameters` (moments, velocities)."""

    # --- devices -------------------------------------------------------------------------
    @abc.abstractmethod
    def cuda_built(self) -> bool:
        """True when the installed framework is built with CUDA (it may still see no GPU)."""

    @abc.abstractmethod
    def device_count(self) -> int:
        """The GPUs this process can see (after CUDA_VISIBLE_DEVICES); 0 on a CPU build."""

    @abc.abstractmethod
    def set_device(self, device: Device) -> None:
        """Bind `device`: new tensors, received buffers and stages are made there. Called
        before the process group starts, so that NCCL binds the same GPU."""

    @abc.abstractmethod
    def to_device(self, obj: Any) -> Any:
        """A layer (moved in place) or a tensor (a copy) on the bound device; on the CPU, `obj`."""

    @abc.abstractmethod
    def is_on_gpu(self, t: Any) -> bool: ...

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Wait for every kernel queued on the bound GPU (a timer must not stop at a launch)."""

    # --- the process group ---------------------------------------------------------------
    @abc.abstractmethod
    def init_process_group(self) -> None:
        """Join the job's default group from the launcher's environment."""

    @abc.abstractmethod
    def destroy_process_group(self) -> None:
        """Leave the default group at the end of a run whose ranks all finished (the
        framework's own teardown at interpreter exit may abort the process otherwise)."""

    @abc.abstractmethod
    def open_store(self, seconds: float) -> Any:
        """A connection of its own to the key-value store the default group was made with
        (`add(key, n) -> int`, `set(key, bytes)`, `get(key) -> bytes`), for the failure
        notices (`notices.Board`); `seconds` bounds a wait where the framework offers it.
        It may block while the store is not there: open it on a thread that may wait."""

    @abc.abstractmethod
    def job_store(self) -> Any:
        """The key-value store the default group was made with (`set`, `add`, `get`), which
        the first step's notes go through (`transport/notes.py`); None without a group."""

    @abc.abstractmethod
    def is_initialized(self) -> bool: ...

    @abc.abstractmethod
    def rank(self) -> int: ...

    @abc.abstractmethod
    def world_size(self) -> int: ...

    @abc.abstractmethod
    def backend(self) -> str:
        """The default group's backend (`gloo`, `nccl`), lower case."""

    @abc.abstractmethod
    def default_backend(self) -> str:
        """The backend a run starts with when its launcher names none."""

    @abc.abstractmethod
    def all_gather_object(self, obj: Any) -> list[Any]: ...

    @abc.abstractmethod
    def barrier(self) -> None: ...

    @abc.abstractmethod
    def new_group(self, ranks: list[int]) -> Any: ...

    @abc.abstractmethod
    def all_reduce(self, tensor: Any, group: Any) -> None:
        """Sum `tensor` in place over `group`'s members, blocking until done. Called from a
        background thread: it may not run framework operators, only the collective."""

    @abc.abstractmethod
    def link(self, group: Any, rank: int, peer: int) -> tuple[Callable[[Any], None], Callable[[Any], None]]:
        """Blocking (send, receive) of one tensor to `peer` over a 2-rank `group`."""

    @abc.abstractmethod
    def batch(self, ops: Sequence[tuple[bool, Any, int, Any]]) -> None:
        """(is_send, tensor, peer, group) posted together and waited for: NCCL's group call."""

    # --- sharded stages ------------------------------------------------------------------
    #: Why this adapter cannot shard stages (None: it can).
    sharding_refused: str | None = "sharded stages are not supported here"

    def sharded(self, layer: Any) -> ShardedWeights | None:
        """The sharding of `layer`'s weights (None: the layer holds them whole)."""
        return None

    def shard_stages(self, layers: dict[int, Any], copies: int, shards: int, pipeline: int,
                     reshard_after_forward: bool) -> None:
        """Shard each stage layer over its `shards` ranks (`process_layout.Layout.shard_mesh`)."""
        raise UsageError(self.sharding_refused or "sharded stages are not supported here")

    #: Why this adapter cannot split stages over tensor-parallel ranks (None: it can).
    tensor_parallel_refused: str | None = "tensor-parallel stages are not supported here"

    def split_stages(self, layers: dict[int, Any], replicas: int, pipeline: int, tensor: int,
                     parallelize: Callable[[Any, Any], None] | None) -> None:
        """Split each stage layer over its `tensor` ranks (`Layout.tensor_ranks`): with the
        user's `parallelize(layer, mesh)`, else the built-in model's plan."""
        raise UsageError(self.tensor_parallel_refused or "tensor-parallel stages are not supported here")

    def is_split(self, t: Any) -> bool:
        """Whether `t` is split over ranks (each holds a part: count it on every rank); a
        tensor every rank holds whole counts once."""
        return False


def installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ValueError, ImportError):  # `sys.modules[name] = None`, or a finder that refuses it: absent
        return False


def require(name: str) -> None:
    """UsageError naming the install command when framework `name` cannot be used."""
    if name not in FRAMEWORKS:
        raise UsageError(f"unknown framework {name!r}; choose one of {', '.join(FRAMEWORKS)}")
    if not installed(name):
        what = "PaddlePaddle" if name == PADDLE else "PyTorch"
        raise UsageError(f"{what} is not installed: {_INSTALL[name]}")


def default_framework() -> str:
    """Paddle where it is installed, else PyTorch where that is, else Paddle (whose absence
    `require` then says how to mend)."""
    if installed(PADDLE) or not installed(TORCH):
        return PADDLE
    return TORCH


_MADE: dict[str, Framework] = {}


def get_framework(name: str = PADDLE) -> Framework:
    """The adapter of `name` (made once per process)."""
    made = _MADE.get(name)
    if made is None:
        require(name)
        module = importlib.import_module(_MODULES[name])
        made = _MADE[name] = module.ADAPTER()
    return made


def framework_name_of(obj: Any) -> str | None:
    """`torch` for a `torch.nn.Module` or `torch.Tensor`, `paddle` for a `paddle.nn.Layer` or
    `paddle.Tensor`, whoever defined the class; None for anything else. Decided by type: an
    object of a framework's class means that framework is already imported."""
    torch = sys.modules.get(TORCH)
    if torch is not None and isinstance(obj, (torch.nn.Module, torch.Tensor)):
        return TORCH
    paddle = sys.modules.get(PADDLE)
    if paddle is not None and isinstance(obj, (paddle.nn.Layer, paddle.Tensor)):
        return PADDLE
    return None


def framework_of(obj: Any, what: str = "a stage") -> Framework:
    """The adapter of the framework `obj` belongs to; a TypeError naming `obj`'s type when it
    belongs to neither."""
    name = framework_name_of(obj)
    if name is None:
        cls = type(obj)
        raise TypeError(f"{what} must be a torch.nn.Module or a paddle.nn.Layer, got "
                        f"{cls.__module__}.{cls.__qualname__}")
    return get_framework(name)
