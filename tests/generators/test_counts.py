"""A generator's `steps` is the number of steps its rows hold, counted without building them:
the parser refuses a program past its limit by this count, so it must be exact."""

from __future__ import annotations

import pytest

from ppdsl.generators import registry

SIZES = [(1, 1), (1, 4), (2, 4), (3, 6), (4, 8), (4, 9), (4, 16), (5, 10), (8, 16), (8, 17), (8, 32)]


@pytest.mark.parametrize("name", sorted(registry.REGISTRY))
def test_the_count_is_what_the_generator_makes(name: str) -> None:
    checked = 0
    virtuals = [{}, {"virtual": 1}, {"virtual": 3}] if any(p.name == "virtual" for p in registry.lookup(name).params) else [{}]
    for ranks, microbatches in SIZES:
        for args in virtuals:
            for inference in (False, True):
                try:
                    built = registry.expand(name, ranks, microbatches, args, inference)
                except registry.GeneratorError:
                    continue  # a size this generator refuses (dualpipev needs m >= 2p, VPP divisible rounds)
                assert registry.count(name, ranks, microbatches, args, inference) == sum(map(len, built.rows)), \
                    (ranks, microbatches, args, inference)
                checked += 1
    assert checked >= 10


def test_counting_a_trillion_builds_nothing() -> None:
    assert registry.count("vpp", 65536, 1048576, {"virtual": 8}) == 65536 * 8 * 1048576 * 2
    assert registry.count("dualpipev", 65536, 1048576, {}) > 10**11


def test_counting_checks_the_arguments_as_expand_does() -> None:
    with pytest.raises(registry.GeneratorError) as info:
        registry.count("vpp", 4, 8, {"virtual": 0})
    assert info.value.code == "PPS022" and info.value.argument == "virtual"
    with pytest.raises(registry.GeneratorError) as info:
        registry.count("nope", 4, 8, {})
    assert info.value.code == "PPS020"
