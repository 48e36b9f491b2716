"""`grad += x^T @ dy` as one GEMM into the gradient's buffer: exact where it runs, refused elsewhere."""

from __future__ import annotations

from typing import Any

import pytest

paddle = pytest.importorskip("paddle")

import numpy as np  # noqa: E402  # after the skip: numpy comes with the paddle extra

from ppdsl.runtime.paddle_backend import blas  # noqa: E402


def _tensors(dtype: str, k: int = 7, m: int = 5, n: int = 3, seed: int = 0) -> tuple[Any, Any, Any]:
    rng = np.random.default_rng(seed)
    return tuple(paddle.to_tensor(rng.standard_normal(shape).astype(dtype)) for shape in ((m, n), (k, m), (k, n)))


@pytest.fixture(autouse=True)
def library_loaded() -> None:
    """Paddle maps its math library with its first matmul; the lookup is cached per process."""
    paddle.matmul(paddle.ones([2, 2]), paddle.ones([2, 2]))
    if blas._gemms() is None:
        pytest.skip("this Paddle build maps no cblas library (the autograd way is taken)")


@pytest.mark.parametrize(("dtype", "rtol"), [("float64", 1e-13), ("float32", 1e-5)])
def test_the_product_is_added_into_the_gradient_in_place(dtype: str, rtol: float) -> None:
    grad, x, dy = _tensors(dtype)
    before, ptr = grad.numpy().copy(), grad.data_ptr()
    want = before.astype(np.float64) + x.numpy().astype(np.float64).T @ dy.numpy().astype(np.float64)
    assert blas.accumulate_product(grad, x, dy)
    assert grad.data_ptr() == ptr and grad.dtype == x.dtype
    np.testing.assert_allclose(grad.numpy(), want, rtol=rtol, atol=rtol)
    assert blas.accumulate_product(grad, x, dy)  # twice: added twice
    np.testing.assert_allclose(grad.numpy(), want + (want - before), rtol=rtol, atol=rtol)


def test_it_equals_the_autograd_way() -> None:
    grad, x, dy = _tensors("float64", k=128, m=40, n=24, seed=1)
    other = grad.clone()
    other.add_(paddle.matmul(x, dy, transpose_x=True))
    assert blas.accumulate_product(grad, x, dy)
    np.testing.assert_allclose(grad.numpy(), other.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("why", ["dtype", "mixed dtypes", "shape", "3-D", "empty", "non-contiguous", "overlap"])
def test_what_it_cannot_do_exactly_it_refuses_and_leaves_alone(why: str) -> None:
    grad, x, dy = _tensors("float64")
    if why == "dtype":
        grad, x, dy = _tensors("float16")
    elif why == "mixed dtypes":
        x = x.astype("float32")
    elif why == "shape":
        grad = paddle.zeros([5, 4], dtype="float64")
    elif why == "3-D":
        x, dy = x.reshape([1, 7, 5]), dy.reshape([1, 7, 3])
    elif why == "empty":
        grad, x, dy = _tensors("float64", k=0)
    elif why == "overlap":  # BLAS may not write where it reads: x and the gradient share a buffer
        x = paddle.ones([4, 4], dtype="float64")
        grad, dy = x, paddle.ones([4, 4], dtype="float64")
    else:
        x = paddle.as_strided(paddle.to_tensor(np.ascontiguousarray(x.numpy().T)), shape=[7, 5], stride=[1, 7])
        assert not x.is_contiguous()  # x^T's buffer read as x: the values are x's, the layout is not
    before = grad.numpy().copy()
    assert not blas.accumulate_product(grad, x, dy)
    assert np.array_equal(grad.numpy(), before)


def test_an_environment_switch_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PPDSL_FUSED_WEIGHT_GRAD", "0")
    blas._gemms.cache_clear()
    try:
        grad, x, dy = _tensors("float64")
        assert not blas.accumulate_product(grad, x, dy)
    finally:
        monkeypatch.delenv("PPDSL_FUSED_WEIGHT_GRAD")
        blas._gemms.cache_clear()
    assert blas._gemms() is not None
