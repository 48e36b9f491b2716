"""`python -m ppdsl`, and `python path/to/ppdsl` (how Paddle 3.3's launcher runs `-m ppdsl`)."""

import os
import sys

if not __package__:
    # Run as a file: this folder is sys.path[0], where its modules would shadow real ones
    # (`runtime`, `check`, ...); import the package from the folder above instead.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
    sys.path.insert(0, os.path.dirname(_here))

from ppdsl.cli import entry  # noqa: E402

entry()
