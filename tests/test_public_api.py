"""The Python API's surface: `dir(ppdsl)` is the public API, a diagnostic prints as text."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

import ppdsl
from conftest import ROOT
from ppdsl.cli import main
from ppdsl.diagnostics import Diagnostic, Severity, render_text


def test_dir_lists_the_public_api_only() -> None:
    assert dir(ppdsl) == sorted(ppdsl.__all__)
    assert "Any" not in dir(ppdsl) and "TYPE_CHECKING" not in dir(ppdsl)
    assert all(hasattr(ppdsl, name) for name in dir(ppdsl))


def test_str_of_a_diagnostic_is_its_text() -> None:
    d = Diagnostic("PPS107", "`0B0` at step 0 runs before `0F0`", "a.pps", 2, 9, severity=Severity.ERROR,
                   notes=("rank 0",), help="move `0B0` after `0F0`")
    assert str(d) == ("a.pps:2:9: error[PPS107]: `0B0` at step 0 runs before `0F0`\n"
                      "  = note: rank 0\n  = help: move `0B0` after `0F0`")
    assert str(d) == render_text(d) and repr(d).startswith("Diagnostic(code='PPS107'")


def test_the_checks_md_python_example_prints_what_lint_prints(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    page = (ROOT / "docs" / "checks.md").read_text(encoding="utf-8")
    code = next(b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "render_text" in b)
    monkeypatch.chdir(ROOT)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/checks.md", "exec"), {})  # noqa: S102 - the documented example, as a user runs it
    assert main(["lint", "tests/check/data/paddle_1f1b_2ranks.pps"]) == 1
    linted = capsys.readouterr().out.strip()
    printed = out.getvalue()
    assert linted and linted in printed
    header = linted.splitlines()[0]
    assert printed.startswith(header + "\n  = note:")  # print(d): the header, then notes, no excerpt
