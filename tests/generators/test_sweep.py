"""Every generator's output is a sound schedule across the grid ranks 2..16, microbatches 1..64,
virtual 1..4.

Sampled, to stay within seconds on 2 shared cores: every rank count 2..16, with microbatch
counts {1, 2, 3, 5, 7, 8, 13, 16, 31, 32, 64} (the edges, small counts below the rank count,
primes, powers of two, one below a power of two), plus the rank count itself and twice it.
Generators with `virtual` take 1..4 on every other rank count and 2 on the rest. A
configuration the generator refuses must be refused with PPS022; every other one must pass.
"""

from __future__ import annotations

import pytest

from gen_helpers import build, problems
from ppdsl.generators import registry

MICROBATCHES = (1, 2, 3, 5, 7, 8, 13, 16, 31, 32, 64)
RANKS = range(2, 17)


def _configs(name: str) -> list[tuple[int, int, dict[str, object]]]:
    spec = registry.REGISTRY[name]
    virtual = any(p.name == "virtual" for p in spec.params)
    out = []
    for ranks in RANKS:
        counts = sorted({*MICROBATCHES, ranks, 2 * ranks})
        virtuals = (1, 2, 3, 4) if virtual and ranks % 2 == 0 else (2,) if virtual else (None,)
        for v in virtuals:
            for m in counts:
                out.append((ranks, m, {} if v is None else {"virtual": v}))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(registry.REGISTRY))
def test_every_valid_configuration_is_sound(name: str) -> None:
    accepted = refused = 0
    for ranks, m, args in _configs(name):
        try:
            program = build(name, ranks, m, **args)
        except registry.GeneratorError as err:
            assert err.code == "PPS022", (name, ranks, m, args, err.message)
            refused += 1
            continue
        accepted += 1
        found = problems(program)
        assert not found, f"{name} ranks={ranks} microbatches={m} {args}: {found[:3]}"
    assert accepted > 0
    # Only dualpipev (m >= 2p) and interleaved (m divisible by its rounds; pipeoffload is its
    # rows) refuse anything.
    if name not in ("dualpipev", "interleaved_1f1b", "pipeoffload"):
        assert refused == 0
