"""What the multi-process tests share: a launcher's environment and a rank's printed result."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[3]

# What `ppdsl run` prints for `scaled_linear_model.py`'s Linear subclass: test_run holds the
# run to it, and test_runtime_docs holds docs/runtime.md to the same line.
SPLIT_WARNING = ("ppdsl run: warning: rank 0: stage 0: layer 0 (ScaledLinear) overrides Linear.forward, so its weight "
                 "gradient cannot be deferred to W; it is computed with the input gradient in I")


def generator_files(folder: Path, calls: Sequence[str], ranks: int = 2, microbatches: int = 4,
                    suffix: str = "") -> list[str]:
    """One schedule file per generator call (`"zb1p()"`) in `folder`, named after the generator
    and `suffix`: their paths, in the calls' order."""
    files = []
    for call in calls:
        f = folder / f"{call.split('(')[0]}{suffix}.pps"
        f.write_text(f"pipeline ranks={ranks} microbatches={microbatches}\nuse {call}\n")
        files.append(str(f))
    return files


def launcher_env() -> dict[str, str]:
    """This environment, fit for a launcher (Paddle's, torchrun) started by a test."""
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)  # empty, it makes Paddle's CPU launcher look for a GPU
    env.pop("PPDSL_REPORT_FD", None)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def run_together(commands: Sequence[list[str]], cwd: Path, timeout: float) -> tuple[list[int], list[str]]:
    """Start `commands` side by side (one launcher per "node"), wait for all of them within
    `timeout` seconds, and kill what is left: (exit statuses, combined outputs)."""
    procs = [subprocess.Popen(c, env=launcher_env(), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for c in commands]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    return [p.returncode for p in procs], outputs


def rank_result(log_dir: Path, rank: int) -> Any:
    """The `RESULT {json}` line a side-by-side script printed on `rank`."""
    text = (log_dir / f"rank{rank}.log").read_text()
    line = next(x for x in text.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


STEP_LINE = re.compile(r"^step \d+/\d+  loss [0-9.]+$", re.M)


def progress_lines(text: str) -> list[str]:
    """The `step N/M  loss X` lines in a command's output, in order."""
    return STEP_LINE.findall(text)


def local_progress(ppdsl: str, args: Sequence[str], cwd: Path, timeout: float) -> list[str]:
    """The progress lines `ppdsl run ARGS` prints with its own launcher: what a cluster
    launcher's rank 0 must print for the same file, seed and steps."""
    done = subprocess.run([ppdsl, "run", *args], env=launcher_env(), cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return progress_lines(done.stdout)
