"""`ppdsl run` without `--framework`: the launcher's, else the one a `--model` module imports,
else the one installed (Paddle when both are); and every `ppdsl run` line of the README runs
as written where only PyTorch is installed."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from ppdsl.cli.run_cmd import _chosen_framework
from ppdsl.runtime import framework
from ppdsl.runtime.framework import installed

TORCH_GPT = "examples/torch/gpt/model.py"
PADDLE_GPT = "examples/gpt/model.py"


def test_a_launcher_decides_first() -> None:
    assert _chosen_framework(TORCH_GPT, {"PADDLE_TRAINER_ID": "0"}) == "paddle"
    assert _chosen_framework(None, {"TORCHELASTIC_RUN_ID": "x"}) == "torch"


@pytest.mark.skipif(not (installed("torch") and installed("paddle")), reason="imports both example models")
def test_a_model_module_chooses_by_what_it_imports() -> None:
    assert _chosen_framework(str(ROOT / TORCH_GPT), {}) == "torch"
    assert _chosen_framework(str(ROOT / PADDLE_GPT) + ":build_stage", {}) == "paddle"
    assert _chosen_framework(str(ROOT / "no_such_model.py"), {}) == framework.default_framework()


@pytest.mark.parametrize(("present", "chosen"), [({"paddle", "torch"}, "paddle"), ({"torch"}, "torch"),
                                                 ({"paddle"}, "paddle"), (set(), "paddle")])
def test_otherwise_what_is_installed(monkeypatch: pytest.MonkeyPatch, present: set[str], chosen: str) -> None:
    monkeypatch.setattr(framework, "installed", lambda name: name in present)
    assert _chosen_framework(None, {}) == chosen


# Runs `ppdsl ARGV` in an interpreter where paddle cannot be imported: an install of
# ppdsl[torch] only. The ranks it starts are told `--framework torch`, so they never look.
HIDE_PADDLE = r"""
import sys
sys.modules["paddle"] = None  # importlib.util.find_spec("paddle") now raises: not installed
from ppdsl.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _readme_run_lines() -> list[list[str]]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = []
    for block in re.findall(r"```console\n(.*?)```", readme, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.startswith("$ ppdsl run "):
                lines.append(shlex.split(re.sub(r"\s+#\s.*$", "", line[2:]))[1:])
    return lines


def _imports_paddle(argv: list[str]) -> bool:
    model = argv[argv.index("--model") + 1] if "--model" in argv else None
    return model is not None and "import paddle" in (ROOT / model.split(":")[0]).read_text()


@pytest.mark.slow
@pytest.mark.skipif(not installed("torch"), reason="PyTorch is not installed")
@pytest.mark.parametrize("argv", _readme_run_lines(), ids=lambda a: " ".join(a)[:60])
def test_every_readme_run_line_runs_where_only_torch_is_installed(argv: list[str], tmp_path: Path) -> None:
    for shipped in ("schedules", "examples", "tests"):
        (tmp_path / shipped).symlink_to(ROOT / shipped)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", HIDE_PADDLE, *argv], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    if _imports_paddle(argv):  # a Paddle model: the install command, before any process starts
        assert done.returncode == 2 and "PaddlePaddle is not installed" in done.stderr, done.stderr[-2000:]
    else:
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert " on torch " in done.stdout or " on torch " in done.stderr


def test_the_readme_has_run_lines_of_both_kinds() -> None:
    lines = _readme_run_lines()
    assert sum(map(_imports_paddle, lines)) >= 1 and len(lines) - sum(map(_imports_paddle, lines)) >= 6


def test_a_model_that_fails_to_import_fails_the_same_way_every_time(tmp_path: Path) -> None:
    from ppdsl.diagnostics import UsageError
    from ppdsl.runtime.jobs.models import module_of

    bad = tmp_path / "bad_model.py"
    bad.write_text("def build_stage(i, n):\n    return None\n\nraise RuntimeError('half-way')\n")
    for _ in range(2):  # a half-run module left behind would say "has no build_stage" the second time
        with pytest.raises(UsageError, match="importing .* failed: RuntimeError: half-way"):
            module_of(f"{bad}:build_stage")
