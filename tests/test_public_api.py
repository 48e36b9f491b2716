"""The Python API's surface: `dir(ppdsl)` is the public API, a diagnostic prints as text."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

import ppdsl
from conftest import ROOT
from ppdsl.check import check
from ppdsl.cli import main
from ppdsl.costs import CostModel
from ppdsl.diagnostics import Diagnostic, Severity, render_text
from ppdsl.lower import lower
from ppdsl.simulate import simulate


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


def _program() -> ppdsl.Program:
    return ppdsl.load_program(str(ROOT / "schedules" / "1f1b.pps"))


@pytest.mark.parametrize("call, error, words", [
    (lambda p: check("schedules/1f1b.pps"), TypeError,
     "expected a ppdsl Program (from ppdsl.load_program(path) or ppdsl.parse(text)), not str"),
    (lambda p: simulate(None), TypeError, "not NoneType"),
    (lambda p: lower(None), TypeError, "expected a ppdsl Program"),
    (lambda p: ppdsl.parse(b"pipeline ranks=1 microbatches=1\n"), TypeError, "not bytes: decode it first"),
    (lambda p: check(p, "bogus"), ValueError,
     "comm_model must be one of rendezvous, grouped, buffered, not 'bogus'"),
    (lambda p: check(p, max_memory="6GiB"), TypeError,
     "max_memory is a number of microbatches"),
    (lambda p: check(p, max_memory=-1), ValueError,
     "max_memory must be a finite number above 0, not -1"),
    (lambda p: check(p, memory_weights=[-1.0] * 4), ValueError,
     "memory_weights are finite numbers >= 0"),
    (lambda p: simulate(p, 3), TypeError,
     "costs must be a CostModel, a mapping"),
    (lambda p: CostModel(("F", 1.0)), Exception,
     "costs are (key, value) pairs or a mapping"),
])
def test_the_api_says_what_it_takes(call: object, error: type[Exception], words: str) -> None:
    with pytest.raises(error) as info:
        call(_program())  # type: ignore[operator]
    assert words in str(info.value) or words in getattr(info.value, "message", "")


def test_costs_and_tables_in_the_forms_a_user_writes() -> None:
    from ppdsl.semantics import Timing, execute

    program = _program()
    spans = {simulate(program, costs).makespan
             for costs in ("F=1,B=2", {"F": 1, "B": 2}, CostModel({"F": 1, "B": 2}), CostModel((("F", 1), ("B", 2))))}
    assert len(spans) == 1
    by_kind = execute(program, "rendezvous", Timing.from_table([{ppdsl.Kind.F: 1.0, ppdsl.Kind.B: 2.0}] * 4))
    by_index = execute(program, "rendezvous", Timing.from_table([[1.0, 0.0, 0.0, 2.0]] * 4))
    assert by_kind.starts == by_index.starts and by_kind.makespan == by_index.makespan == spans.pop()
