"""Named schedule generators: `use NAME(key=value, ...)` in a .pps file."""

from .registry import REGISTRY, Built, GeneratorError, GeneratorSpec, Param, expand

__all__ = ["REGISTRY", "Built", "GeneratorError", "GeneratorSpec", "Param", "expand"]
