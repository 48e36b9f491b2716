"""`no_gc()`: pause the cyclic garbage collector around a pass that makes many small objects."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector: checking and lowering make hundreds of thousands of
    small acyclic objects, and each generation-2 pass would rescan all of them (measured: it
    made lowering 64 ranks x 1024 microbatches several times slower)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
