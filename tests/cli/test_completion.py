"""`ppdsl completion bash|zsh|fish`: scripts the shells accept, made from the parser, that
complete subcommands, options, their values and file names."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT
from ppdsl.cli import COMMANDS, build_parser, main
from ppdsl.cli.completion_cmd import commands_of
from ppdsl.codes import CODES


def _script(shell: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    assert main(["completion", shell]) == 0
    path = tmp_path / f"ppdsl.{shell}"
    path.write_text(capsys.readouterr().out)
    return path


def _shell(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed")
    return found


def test_the_model_is_every_command_and_option_of_the_parser() -> None:
    parser, _ = build_parser()
    commands = commands_of(parser)
    assert [c.name for c in commands[1:]] == list(COMMANDS) and commands[0].positional_choices == COMMANDS
    simulate = next(c for c in commands if c.name == "simulate")
    options = {n: o for o in simulate.options for n in o.names}
    assert options["--comm-model"].choices == ("rendezvous", "grouped", "buffered")
    assert options["--costs"].files and options["--costs"].repeats and not options["--critical-path"].takes_value
    search = next(c for c in commands if c.name == "search")
    assert not search.takes_files and not {n: o for o in search.options for n in o.names}["--ranks"].files


def _bash_complete(script: Path, line: str) -> list[str]:
    words = line.split(" ")
    probe = (f"source {script}; COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}; "
             "_ppdsl; printf '%s\\n' \"${COMPREPLY[@]}\"")
    done = subprocess.run([_shell("bash"), "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_bash(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _script("bash", tmp_path, capsys)
    check = subprocess.run([_shell("bash"), "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr
    text = script.read_text()
    assert all(f"        {name})" in text for name in COMMANDS)
    assert _bash_complete(script, "ppdsl ") == [*COMMANDS, "-h", "--help", "--version"]
    assert _bash_complete(script, "ppdsl si") == ["simulate"]
    assert _bash_complete(script, "ppdsl simulate --comm") == ["--comm-model"]
    assert _bash_complete(script, "ppdsl simulate x.pps --comm-model ") == ["rendezvous", "grouped", "buffered"]
    assert _bash_complete(script, "ppdsl lint schedules/1f1b") == ["schedules/1f1b.pps", "schedules/1f1b_written_out.pps"]
    assert _bash_complete(script, "ppdsl search --ranks ") == []
    assert _bash_complete(script, "ppdsl completion ") == ["bash", "zsh", "fish"]
    assert _bash_complete(script, "ppdsl lint --explain PPS21") == sorted(c for c in CODES if c.startswith("PPS21"))


def test_zsh(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _script("zsh", tmp_path, capsys)
    zsh = _shell("zsh")
    check = subprocess.run([zsh, "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr
    text = script.read_text()
    assert text.startswith("#compdef ppdsl\n")
    assert all(f"'{name}:" in text and f"                {name}) _arguments" in text for name in COMMANDS)
    # Sourced, it registers itself with the completion system.
    probe = f"autoload -U compinit; compinit -u -D; source {script}; print -r -- $_comps[ppdsl]"
    done = subprocess.run([zsh, "-f", "-c", probe], capture_output=True, text=True, timeout=30, env={"HOME": str(tmp_path)})
    assert done.stdout.strip() == "_ppdsl", done.stderr


def test_fish(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _script("fish", tmp_path, capsys)
    fish = _shell("fish")
    check = subprocess.run([fish, "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stderr

    def complete(line: str) -> list[str]:
        done = subprocess.run([fish, "--no-config", "-c", f"source {script}; complete -C '{line}'"], cwd=ROOT,
                              capture_output=True, text=True, timeout=30, env={"HOME": str(tmp_path)})
        assert done.returncode == 0, done.stderr
        return [row.split("\t")[0] for row in done.stdout.splitlines()]

    assert set(COMMANDS) <= set(complete("ppdsl "))
    assert complete("ppdsl simulate x.pps --comm-model ") == ["buffered", "grouped", "rendezvous"]
    assert "schedules/" in complete("ppdsl lint sched")


def test_an_unknown_shell_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "tcsh"]) == 2
    assert "invalid choice: 'tcsh' (choose from 'bash', 'zsh', 'fish')" in capsys.readouterr().err


def test_the_documented_commands_print_a_script(capsys: pytest.CaptureFixture[str]) -> None:
    cli_md = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    section = cli_md[cli_md.index("## `ppdsl completion`"):]
    section = section[:section.index("\n## ")]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    shells = re.findall(r"ppdsl completion (\w+)", section)
    assert sorted(set(shells)) == ["bash", "fish", "zsh"] and 'eval "$(ppdsl completion bash)"' in readme
    for shell in shells:
        assert main(["completion", shell]) == 0
        assert "ppdsl" in capsys.readouterr().out
