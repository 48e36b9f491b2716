"""examples/torch: the PyTorch GPT and classifier verify under 1f1b and split-backward schedules
at 2 ranks (the GPT's stages pass a (hidden, mask) tuple whose mask is a non-contiguous view
that goes forward only), and the command at the top of each example trains."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

from ppdsl.cli import main
from procs import generator_files

pytest.importorskip("torch")
ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples" / "torch"
GPT = str(EXAMPLES / "gpt" / "model.py")
CLASSIFIER_PATH = EXAMPLES / "my_model.py"
CLASSIFIER = str(CLASSIFIER_PATH)


def _files(tmp_path: Path, calls: list[str]) -> list[str]:
    return generator_files(tmp_path, calls, suffix="_2")


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, out + err
    return out


def _documented_command(example: Path, steps: int) -> list[str]:
    """The `ppdsl run ...` command in the example's docstring, with `--steps` set to `steps`."""
    doc = ast.get_docstring(ast.parse(example.read_text()), clean=True) or ""
    line = next(x for x in doc.replace("\\\n", " ").splitlines() if x.strip().startswith("ppdsl run "))
    argv = shlex.split(line)[1:]
    argv[argv.index("--steps") + 1] = str(steps)
    return argv


def _loss_falls(out: str) -> tuple[float, float]:
    found = re.search(r"loss ([0-9.]+) -> ([0-9.]+)", out)
    assert found, out
    first, last = map(float, found.groups())
    return first, last


@pytest.mark.slow
def test_gpt_verifies_under_each_schedule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = _files(tmp_path, ["1f1b()", "zb1p()", "zbv()"])
    out = _run(["run", *files, "--framework", "torch", "--model", GPT, "--steps", "2", "--verify", "-q",
                "--timeout", "60"], capsys)
    for f in files:
        assert re.search(rf"{re.escape(f)}: 2 steps, .*verify ok", out), out


@pytest.mark.slow
def test_classifier_verifies_under_zb1p(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = _files(tmp_path, ["zb1p()"])
    spec = [f"{CLASSIFIER}:build_stage", f"{CLASSIFIER}:batches", f"{CLASSIFIER}:loss"]
    out = _run(["run", *files, "--framework", "torch", "--model", spec[0], "--data", spec[1], "--loss", spec[2],
                "--steps", "2", "--verify", "-q", "--timeout", "60"], capsys)
    assert re.search(rf"{re.escape(files[0])}: 2 steps, .*verify ok", out), out


@pytest.mark.slow
def test_the_gpt_command_in_its_docstring_trains(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
                                                 ) -> None:
    monkeypatch.chdir(ROOT)
    first, last = _loss_falls(_run([*_documented_command(EXAMPLES / "gpt" / "model.py", 6), "-q",
                                    "--timeout", "60"], capsys))
    assert last < first - 0.5  # from ~ln(256) = 5.5 towards the corpus' byte statistics


@pytest.mark.slow
def test_the_classifier_command_in_its_docstring_trains(capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    first, last = _loss_falls(_run([*_documented_command(CLASSIFIER_PATH, 20), "-q", "--timeout", "60"], capsys))
    assert last < first - 0.1  # from ~ln(4) = 1.39
