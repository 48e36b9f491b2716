"""Start a benchmark's own worker processes (one per rank, gloo on loopback) and read back
what rank 0 prints on a `RESULT <json>` line. Shared by the runtime benchmarks."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

RESULT = "RESULT "


def run_workers(program_text: str, argv: list[str], script: str) -> Any:
    """`script --worker argv...` on the program's ranks; rank 0's RESULT, or None (reported)."""
    from ppdsl.runtime.launcher import launch
    from ppdsl.runtime.preflight import prepare
    from ppdsl.semantics import CommModel
    from ppdsl.syntax.parser import parse

    program = prepare(parse(program_text, "<bench>"), CommModel.RENDEZVOUS)
    logs = tempfile.mkdtemp(prefix="ppdsl-bench-")
    outcome = launch([program], ["--worker", *argv], steps=0, timeout=120, quiet=True, keep_logs=logs,
                     command=[sys.executable, os.path.abspath(script)])
    text = (Path(logs) / "rank0.log").read_text(errors="replace")
    line = next((x for x in text.splitlines() if x.startswith(RESULT)), None)
    if outcome.code != 0 or line is None:
        print(f"benchmark failed: {outcome.failure}; logs in {logs}", file=sys.stderr)
        return None
    return json.loads(line[len(RESULT):])


def report(result: Any) -> None:
    """What a worker's rank 0 prints for `run_workers`."""
    print(RESULT + json.dumps(result), flush=True)
