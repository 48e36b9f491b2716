"""The model contract, the built-in MLP and its synthetic data, and loading a user's model.

A user's module provides three callables (named on the command line as `module:name` or
`path/to/file.py:name`):

- `build_stage(stage_index, num_stages) -> paddle.nn.Layer` (or `torch.nn.Module` with
  `--framework torch`): one pipeline stage. Its
  `forward` takes and returns a stage value: a tensor, a tuple (the next stage's positional
  arguments) or a dict (its keyword arguments); see values.py. Called with the same seed on every rank
  (and again for `--verify`), so the same stage gets the same initial weights everywhere.
- `batches() -> Iterable[(inputs, targets)]`: whole batches, one per step; the runtime splits
  each along dimension 0 into the schedule's microbatches. Every rank calls it; the first
  stage uses the inputs, the last stage the targets.
- `loss(output, target) -> scalar Tensor`: the loss of one microbatch.

A module may also set `NUM_STAGES = n` to say how many stages it can be cut into.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final

from ...diagnostics import UsageError
from ...wording import plural
from ..framework import FRAMEWORKS, PADDLE, Framework, get_framework, require

BUILTIN = "ppdsl.runtime.jobs.models"
# `--optimizer` names (each framework's adapter maps them to its optimizer classes).
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")


def resolve(model: str | None, data: str | None, loss: str | None) -> tuple[str | None, str | None, str | None]:
    """The three specs in MODULE:NAME form. `--model M` without `:NAME` names a module holding
    the whole contract: M:build_stage, and M:batches / M:loss unless --data / --loss are given.
    `--model M:NAME` names another factory of such a module: its M:batches / M:loss too."""
    if model is not None and ":" in model:
        module = module_of(model)
        path = model.rpartition(":")[0]
        if data is None and callable(getattr(module, "batches", None)):
            data = f"{path}:batches"
        if loss is None and callable(getattr(module, "loss", None)):
            loss = f"{path}:loss"
    if model is not None and ":" not in model:
        module = _import(model, "model")
        factory = getattr(module, "build_stage", None)
        if factory is None:
            raise UsageError(f"--model {model}: the module has no `build_stage`; name the factory as MODULE:NAME")
        if not callable(factory):
            raise UsageError(f"--model {model}: its `build_stage` is {_kind(factory)}, not a function; define "
                             "`build_stage(stage_index, num_stages)`")
        if data is None and callable(getattr(module, "batches", None)):
            data = f"{model}:batches"
        if loss is None and callable(getattr(module, "loss", None)):
            loss = f"{model}:loss"
        model = f"{model}:build_stage"
    return model, data, loss


def check_forms(model: str | None, data: str | None, loss: str | None, optimizer: str) -> None:
    """What the specs' spelling alone tells (no import, so no paddle needed); UsageError."""
    for what, spec in (("model", model), ("data", data), ("loss", loss), ("optimizer", optimizer)):
        if spec is None or (what == "optimizer" and spec in OPTIMIZERS):
            continue
        if ":" not in spec:
            if what == "optimizer":
                raise UsageError(f"--optimizer {spec}: unknown optimizer; choose one of {', '.join(OPTIMIZERS)}, "
                                 "or MODULE:NAME of a factory taking the parameter list")
            if what != "model":  # `--model MODULE` names the whole contract
                raise UsageError(f"--{what} {spec}: expected MODULE:NAME (e.g. mypkg.model:{what})")
            continue
        module_name, _, attr = spec.rpartition(":")
        if not module_name or not attr:
            raise UsageError(f"--{what} {spec}: expected MODULE:NAME (e.g. mypkg.model:build_stage)")


def check_contract(model: str | None, data: str | None, loss: str | None, optimizer: str,
                   stages: Sequence[int], framework: str | None = None) -> tuple[str | None, str | None, str | None]:
    """Everything about `--model/--data/--loss/--optimizer` that can be known without running:
    each imports and is callable, the optimizer is known, the model supports the schedules'
    stage counts and, with `framework`, is written for it. Returns the resolved specs; raises
    UsageError."""
    check_forms(model, data, loss, optimizer)
    model, data, loss = resolve(model, data, loss)
    for what, spec in (("model", model), ("data", data), ("loss", loss)):
        if spec is not None:
            load_callable(spec, what)
    if optimizer not in OPTIMIZERS:
        load_callable(optimizer, "optimizer")
    if model is not None:
        declared = getattr(module_of(model), "NUM_STAGES", None)
        wrong = sorted({n for n in stages if declared is not None and n != declared})
        if wrong:
            raise UsageError(f"--model {model}: the model has NUM_STAGES={declared} but the schedule has "
                             f"{plural(wrong[0], 'stage')}")
        if framework is not None:
            _check_framework(model, module_of(model), framework)
    return model, data, loss


def frameworks_imported(module: Any) -> set[str]:
    """The frameworks (of `FRAMEWORKS`) whose modules or objects a model module holds."""
    used = set()
    for value in vars(module).values():
        name = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
        if isinstance(name, str):
            used.add(name.partition(".")[0])
    return used & set(FRAMEWORKS)


def framework_of_model(model: str) -> str | None:
    """The one framework `--model MODEL`'s module imports, or None (neither, both, or a module
    that does not import: the contract check says why later)."""
    try:
        module = module_of(model) if ":" in model else _import(model, "model")
    except UsageError:
        return None
    used = frameworks_imported(module)
    return used.pop() if len(used) == 1 else None


def _check_framework(spec: str, module: Any, framework: str) -> None:
    """A model module that imports only the other framework would fail on every rank after
    they start: said before, with the option that runs it."""
    used = frameworks_imported(module)
    other = next((f for f in FRAMEWORKS if f != framework), framework)
    if other in used and framework not in used:
        flag = f"--framework {other}"
        raise UsageError(f"--model {spec}: the module imports {other}, not {framework}: run it with {flag}")


def batch_rows(spec: str, framework: str) -> int | None:
    """The rows (dimension 0) of the first batch that `--data spec` yields, read once before
    any rank starts; None when its inputs hold no tensor with a dimension."""
    from ..interpreter.values import split

    source = load_callable(spec, "data")
    try:
        inputs, _ = next(iter(source()))
    except Exception as exc:  # noqa: BLE001 - the user's data failed
        raise UsageError(f"--data {spec}: reading its first batch raised {type(exc).__name__}: {exc}") from None
    fw = get_framework(framework)
    for member in split(inputs)[1]:
        if fw.is_tensor(member) and len(member.shape):
            return int(member.shape[0])
    return None


def load_callable(spec: str, what: str) -> Callable[..., Any]:
    """`pkg.module:name` or `path/file.py:name` -> the object; UsageError when it is not there."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"--{what} {spec}: expected MODULE:NAME (e.g. mypkg.model:build_stage)")
    module = _import(module_name, what)
    obj = getattr(module, attr, None)
    if obj is None:
        raise UsageError(f"--{what} {spec}: module `{module_name}` has no `{attr}`")
    if not callable(obj):
        raise UsageError(f"--{what} {spec}: `{attr}` is not callable")
    return obj  # type: ignore[no-any-return]


def _kind(value: object) -> str:
    """A value's type as a user reads it: where it comes from too (`paddle.nn...Sequential`
    returned to torch says which framework the model was written for)."""
    kind = type(value)
    where = kind.__module__
    return kind.__qualname__ if where == "builtins" else f"{where}.{kind.__qualname__}"


def tensor_plan(model: str) -> Any:
    """The `parallelize(stage, mesh)` of `--model`'s module: how its stages split over
    tensor-parallel ranks (`--tp`); SetupFailure when it has none."""
    plan = getattr(module_of(model), "parallelize", None)
    if not callable(plan):
        raise SetupFailure(f"--tp: the model module of {model} has no `parallelize(stage, mesh)` saying how a stage "
                           "splits over tensor-parallel ranks (the built-in model has its own); define one, e.g. "
                           "with torch.distributed.tensor.parallel.parallelize_module")
    return plan


def module_of(spec: str) -> Any:
    return _import(spec.rpartition(":")[0], "model")


def _contract(what: str) -> str:
    """What `--model/--data/--loss/--optimizer` should name instead."""
    if what == "model":
        return ("give a .py file or an importable module that defines `build_stage` "
                "(e.g. `--model examples/gpt/model.py`; see docs/runtime.md)")
    example = {"data": " (e.g. `--data examples/gpt/model.py:batches`)", "loss": " (e.g. `--loss examples/gpt/model.py:loss`)"}
    return f"give MODULE:NAME of a Python module or .py file{example.get(what, '')}"


def _import(module_name: str, what: str) -> Any:
    try:
        folder = Path(module_name).is_dir() and not (Path(module_name) / "__init__.py").is_file()
        if module_name.endswith(".py") or "/" in module_name or folder:
            path = Path(module_name)
            if path.is_dir():  # a model's folder names its model.py
                if not (path / "model.py").is_file():
                    raise UsageError(f"--{what} {module_name}: is a folder with no model.py in it; {_contract(what)}")
                path = path / "model.py"
            if not path.is_file():
                raise UsageError(f"--{what}: no such file {module_name}")
            if path.suffix != ".py":
                raise UsageError(f"--{what} {module_name}: not a Python file (`.py`); {_contract(what)}")
            # One module per file, not per file name: two `model.py` files are two modules.
            name = "_ppdsl_user_" + path.stem + "_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
            if name in sys.modules:
                return sys.modules[name]
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:  # pragma: no cover - a .py file always has a loader
                raise UsageError(f"--{what} {module_name}: Python cannot load this file; {_contract(what)}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]  # as Python's own import does: the next import tries again
                raise
            return module
        if "" not in sys.path and "." not in sys.path:
            sys.path.insert(0, "")  # the user's own package in the working directory
        return importlib.import_module(module_name)
    except UsageError:
        raise
    except ModuleNotFoundError as exc:
        if exc.name in FRAMEWORKS:  # the model's framework is missing: say how to install it
            try:
                require(exc.name)
            except UsageError as missing:
                raise UsageError(f"--{what} {module_name} imports {exc.name}: {missing}") from None
        raise UsageError(f"--{what}: cannot import `{module_name}`: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the user's module failed while importing
        raise UsageError(f"--{what}: importing `{module_name}` failed: {type(exc).__name__}: {exc}") from None


# --- the built-in model: a small MLP cut into as many stages as the schedule has ----------

WIDTH = 32
LAYERS_PER_STAGE = 2
BATCH_PER_MICROBATCH = 4
DTYPE: Final = "float64"


def build_stage(stage_index: int, num_stages: int, *, seed: int = 0, framework: str = PADDLE) -> Any:
    """`LAYERS_PER_STAGE` Linear+Tanh blocks; the last stage ends in a Linear to one output.

    The weights are drawn with numpy from (seed, stage), not by the framework, so Paddle and
    PyTorch start from the same numbers and print the same losses for the same file and seed.
    float64: then `--verify` compares pipeline logic, not float32 rounding (a schedule that
    accumulates microbatch gradients in another order differs from the reference by ~1e-6)."""
    import numpy as np

    rng = np.random.default_rng([seed, stage_index])
    shapes = [(WIDTH, WIDTH)] * LAYERS_PER_STAGE + ([(WIDTH, 1)] if stage_index == num_stages - 1 else [])
    weights, biases = [], []
    for fan_in, fan_out in shapes:
        bound = np.sqrt(6.0 / (fan_in + fan_out))  # Xavier-uniform, zero bias: Paddle's default Linear init
        weights.append(rng.uniform(-bound, bound, (fan_in, fan_out)).astype(DTYPE))
        biases.append(np.zeros(fan_out, dtype=DTYPE))
    tanh = [True] * LAYERS_PER_STAGE + [False] * (len(shapes) - LAYERS_PER_STAGE)
    return get_framework(framework).mlp(weights, biases, tanh)


def synthetic_batches(microbatches: int, seed: int = 0, batch: int | None = None,
                      framework: str = PADDLE) -> Iterator[tuple[Any, Any]]:
    """A regression task the MLP can learn: y = sin(x . w / sqrt(WIDTH)) for a fixed random w.

    Drawn with numpy's own generator so every rank (and either framework) gets the same
    numbers without touching the framework's global random state."""
    import numpy as np

    fw = get_framework(framework)
    n = batch or BATCH_PER_MICROBATCH * microbatches
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((WIDTH, 1)).astype(DTYPE)
    while True:
        x = rng.standard_normal((n, WIDTH)).astype(DTYPE)
        # Scaled so x . w has unit variance: a teacher the small MLP visibly learns in a few steps.
        yield fw.from_numpy(x), fw.from_numpy(np.sin(x @ w / np.sqrt(WIDTH)))


def loss(output: Any, target: Any) -> Any:
    """Mean squared error, in operators both frameworks' tensors have."""
    return ((output - target) ** 2).mean()


# Building what a rank trains, shared by the worker and `--verify`'s single-process copy.


class SetupFailure(Exception):
    """A rank cannot set up what it trains (world size, model, data): reported, not a traceback."""


def build_stages(build: Any, stages: tuple[int, ...], num_stages: int, seed: int, name: str,
                 fw: Framework | None = None) -> dict[int, Any]:
    """Each stage from the same seed on every rank, so weights agree with `--verify`'s copy."""
    fw = fw or get_framework()
    layers = {}
    for s in stages:
        fw.seed(seed * 1_000_003 + s)
        try:
            layer = build_stage(s, num_stages, seed=seed, framework=fw.name) if build is build_stage \
                else build(s, num_stages)
        except Exception as exc:  # noqa: BLE001 - the user's factory failed
            raise SetupFailure(f"model {name}: build_stage({s}, {num_stages}) raised {type(exc).__name__}: {exc}") from None
        if not fw.is_layer(layer):
            raise SetupFailure(f"model {name}: build_stage({s}, {num_stages}) returned {_kind(layer)}, "
                               f"not a {fw.layer_type}")
        layers[s] = fw.to_device(layer)
    return layers


def make_optimizer(spec: str, lr: float, parameters: list[Any], fw: Framework | None = None) -> Any:
    if spec in OPTIMIZERS:
        return (fw or get_framework()).make_optimizer(spec, lr, parameters)
    factory = load_callable(spec, "optimizer")
    return factory(parameters)
