"""How many intra-op threads each local rank gets (no paddle needed)."""

from __future__ import annotations

import pytest

import ppdsl.runtime.launcher as launcher
from ppdsl.runtime.launcher import threads_per_rank


def test_threads_per_rank_fits_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(launcher, "cores", lambda: 8)
    assert threads_per_rank(2) == (4, "8 cores / 2 ranks")
    assert threads_per_rank(3)[0] == 2 and threads_per_rank(16)[0] == 1  # never 0
    assert threads_per_rank(2, 3) == (3, "--threads")
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert threads_per_rank(2) == (5, "OMP_NUM_THREADS")
