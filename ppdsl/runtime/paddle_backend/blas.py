"""`grad += x^T @ dy` as one GEMM into the gradient's own buffer, on CPU.

A deferred weight gradient made the autograd way writes a fresh product and then reads it
back for the in-place add: on a 768 x 768 weight that is two passes over 2.4 MB that the
GEMM itself can do, since BLAS accumulates (`beta = 1`). Measured in the pipeline, the add
alone was 0.54 ms of every layer's `W` against 9-10 ms for the GEMM. Paddle's own
zero-bubble code fuses the two on GPU (`fused_linear_param_grad_add`), which has no CPU
kernel; so on CPU this calls `cblas_?gemm` of the math library Paddle itself has loaded
(MKL's, found among the process's mapped files), on the tensors' buffers.

Anything it cannot do safely (another device, dtype or layout, a gradient sharing memory
with an operand, no such library, or `PPDSL_FUSED_WEIGHT_GRAD=0`) answers False and the
caller takes the autograd way. The sum is the same up to float rounding (the GEMM adds the
old gradient in its own order), not bit for bit.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable
from typing import Any

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_INT_MAX = 2**31 - 1  # cblas takes C ints
# Paddle's CPU wheels load MKL as this file. Not `libmkl_rt`: another package may map that
# one, with its own settings (its ILP64 layer takes 64-bit ints where these are 32-bit).
_LIBRARY = "libmklml_intel.so"

Gemm = Callable[..., None]


def _loaded_library() -> str | None:
    """The path of a BLAS with cblas_?gemm that this process has already mapped."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(" ", 1)[-1].strip()
                if os.path.basename(path).startswith(_LIBRARY):
                    return path
    except OSError:  # not Linux
        return None
    return None


@functools.cache
def _gemms() -> dict[str, Gemm] | None:
    if os.environ.get("PPDSL_FUSED_WEIGHT_GRAD", "1") == "0":
        return None
    path = _loaded_library()
    if path is None:  # Paddle maps its math library with its first CPU op: make one, look again
        import paddle

        untyped: Any = paddle
        untyped.matmul(untyped.ones([1, 1]), untyped.ones([1, 1]))
        path = _loaded_library()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)  # the same handle Paddle holds: its thread setting applies
        found: dict[str, Gemm] = {}
        for dtype, name, real in (("float32", "cblas_sgemm", ctypes.c_float), ("float64", "cblas_dgemm", ctypes.c_double)):
            fn = getattr(lib, name)
            fn.restype = None
            fn.argtypes = [ctypes.c_int] * 6 + [real, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                                 real, ctypes.c_void_p, ctypes.c_int]
            found[dtype] = fn
    except (OSError, AttributeError):
        return None
    return found


def _dtype_name(t: Any) -> str:
    return str(t.dtype).rsplit(".", 1)[-1]  # paddle.float32 -> float32


def accumulate_product(grad: Any, x: Any, dy: Any) -> bool:
    """grad += x^T @ dy in place for 2-D x [k, m], dy [k, n], grad [m, n]; False: not done."""
    if x.ndim != 2 or dy.ndim != 2 or grad.ndim != 2:
        return False
    (k, m), (k2, n) = x.shape, dy.shape
    if k != k2 or list(grad.shape) != [m, n] or max(k, m, n) > _INT_MAX or 0 in (k, m, n):
        return False
    dtype = _dtype_name(grad)
    if _dtype_name(x) != dtype or _dtype_name(dy) != dtype:
        return False
    if not all(t.place.is_cpu_place() and t.is_contiguous() for t in (grad, x, dy)):
        return False
    size = grad.element_size()
    start = grad.data_ptr()
    end = start + m * n * size
    for t in (x, dy):  # BLAS may not write where it reads
        other = t.data_ptr()
        if other < end and start < other + k * t.shape[1] * size:
            return False
    gemms = _gemms()
    gemm = gemms.get(dtype) if gemms is not None else None
    if gemm is None:
        return False
    gemm(_ROW_MAJOR, _TRANS, _NO_TRANS, m, n, k, 1.0, x.data_ptr(), m, dy.data_ptr(), n, 1.0, start, n)
    return True
