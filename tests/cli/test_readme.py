"""The README's tour: every command it shows names files that ship (or that an earlier command
of the tour writes), and runs as shown: its exit status, and the output lines it quotes.
`ppdsl run` lines are parsed and their files checked, not run (tests/runtime runs training)."""

from __future__ import annotations

import glob
import re
import shlex
from pathlib import Path

import pytest

from conftest import ROOT
from ppdsl.cli import build_parser, main

README = (ROOT / "README.md").read_text(encoding="utf-8")
SHIPPED = ("schedules", "examples", "tests", "docs")


def tour() -> list[tuple[list[str], list[str]]]:
    """(argv, the output lines shown under it) of every `$ ...` line of a console block."""
    out: list[tuple[list[str], list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", README, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.startswith("$ "):
                out.append((shlex.split(re.sub(r"\s+#\s.*$", "", line[2:])), []))
            elif line.strip():
                out[-1][1].append(line)
    return out


def _run_args(argv: list[str]) -> list[str]:
    """The `run ...` part of a `ppdsl run` or `python -m paddle.distributed.launch ... ppdsl run` line."""
    return argv[argv.index("run"):]


def test_the_tour_names_no_file_that_does_not_ship() -> None:
    made = {"out.json"}  # by `ppdsl run --profile out.json`, which this test does not run
    parser, _ = build_parser()
    for argv, _shown in tour():
        if "run" not in argv:
            continue
        args = parser.parse_args(_run_args(argv))
        assert all((ROOT / f).is_file() for f in args.file), argv
        for spec in (args.model, args.data, args.loss):
            if spec is not None and ".py" in spec:
                assert (ROOT / spec.split(":")[0]).is_file(), spec
        if args.profile:
            assert args.profile in made


def test_the_tour_runs_as_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    for name in SHIPPED:  # the shipped files at their README paths; what the tour writes lands here
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    ran = 0
    for argv, shown in tour():
        if "run" in argv or argv[0] != "ppdsl" or "out.json" in argv:
            continue  # training (and what reads its profile): see the test above
        args = [match for word in argv[1:] for match in (sorted(glob.glob(word)) if "*" in word else [word])]
        code = main(args)
        out = capsys.readouterr()
        expected = 1 if any("error[" in line for line in shown) else 0
        assert code == expected, (argv, out.err[-2000:])
        printed = (out.out + out.err).splitlines()
        assert all(line in printed for line in shown), (argv, shown)
        ran += 1
    assert ran >= 10
