"""docs/runtime.md: its drop-in snippets are the lines the side-by-side test runs, each of its
`ppdsl run` command lines is one the CLI accepts, with files that exist, and it shows what
`ppdsl run` prints: the memory lines and the split warning (no paddle)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from ppdsl.cli import build_parser
from ppdsl.cli.run_cmd import memory_line
from procs import SPLIT_WARNING

ROOT = Path(__file__).parents[2]
DOC = (ROOT / "docs" / "runtime.md").read_text()
CLI_DOC = (ROOT / "docs" / "cli.md").read_text()


def _blocks(lang: str, doc: str = DOC) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", doc, re.S)


def _section(title: str) -> str:
    start = DOC.index(title)
    return DOC[start:DOC.index("\n#", start + len(title))]


def test_the_drop_in_snippets_are_what_the_side_by_side_test_runs() -> None:
    for title, script_name, count in (("## A drop-in for Paddle's", "paddle_api_pair.py", 3),
                                      ("### A drop-in for `torch.distributed.pipelining`", "torch_api_pair.py", 2)):
        script = (Path(__file__).parent / "helpers" / script_name).read_text()
        snippets = [b for b in _blocks("python", _section(title)) if "PipelineStage(" in b or "if rank == 0:" in b]
        assert len(snippets) == count, title
        for block in snippets:
            for line in block.splitlines():
                line = line.strip().replace('"1f1b.pps"', "path")
                if line:
                    assert line in script, line


def test_the_fsdp_api_lines_are_what_the_sharded_test_runs() -> None:
    script = (Path(__file__).parent / "helpers" / "fsdp_api.py").read_text()
    blocks = _blocks("python", _section("## Sharded stages (FSDP2)"))
    assert len(blocks) == 1
    for line in blocks[0].splitlines():
        assert line.strip() in script, line


def test_the_tied_declarations_shown_are_the_tied_gpt_examples() -> None:
    example = (ROOT / "examples" / "torch" / "gpt" / "model.py").read_text()
    blocks = _blocks("python", _section("### Tied parameters"))
    assert len(blocks) == 1
    for line in blocks[0].splitlines():
        assert line.split("#")[0].strip() in example, line


def test_every_documented_run_command_parses(tmp_path: Path) -> None:
    parser, _ = build_parser()
    commands = []
    for block in _blocks("sh") + [b for b in _blocks("console", CLI_DOC) if "$ ppdsl run" in b]:
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#")[0].strip()
            if "ppdsl run" in line and "FILE..." not in line:
                commands.append(shlex.split(line[line.index("ppdsl run") + len("ppdsl "):]))
    assert any("examples/gpt/model.py" in c for c in commands)
    for argv in commands:
        args = parser.parse_args(argv)
        for spec in (args.model, args.data, args.loss):
            if spec and spec.startswith("examples/"):
                assert (ROOT / spec.split(":")[0]).is_file(), spec


def test_memory_lines_are_what_run_prints() -> None:
    for rank, held in ((0, 1.88), (1, 1.88)):
        line = memory_line({"rank": rank, "peak_microbatches": 2, "predicted_microbatches": 2,
                            "peak_bytes": int(held * 2**20) + 1})
        assert line + "\n" in DOC, line


def test_the_split_warning_is_the_one_a_run_prints() -> None:
    # test_run's real run of scaled_linear_model.py prints exactly SPLIT_WARNING.
    assert f"```text\n{SPLIT_WARNING}\n```" in DOC


@pytest.mark.slow
def test_the_first_run_shown_is_what_run_prints(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("paddle")
    import os

    from ppdsl.cli import main

    shown = re.search(r"ppdsl run: schedules/1f1b.pps: 20 steps, (loss \S+ -> \S+),", DOC)
    assert shown, "docs/runtime.md shows no summary of the first run"
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        code = main(["run", "schedules/1f1b.pps", "-q"])
    finally:
        os.chdir(cwd)
    out = capsys.readouterr().out
    assert code == 0 and f"20 steps, {shown.group(1)}," in out, out


def test_the_handler_example_runs_and_prints_what_it_says() -> None:
    pytest.importorskip("torch")
    import contextlib
    import io

    block = next(b for b in _blocks("python", _section("## Action handlers")) if "register_handler" in b)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "docs/runtime.md", "exec"), {"__name__": "docs_example"})
    said = re.search(r"print\(sorted\(seconds\)\)  # (.*)$", block, re.M)
    assert said is not None and out.getvalue().strip() == said.group(1)
