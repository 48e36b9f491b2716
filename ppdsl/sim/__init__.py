"""Internals of the simulator: the fast timeline engine and the critical path.

The public entry point is `ppdsl.simulate.simulate`.
"""
