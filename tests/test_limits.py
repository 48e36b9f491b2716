"""Every number read from an input is checked against `ppdsl/limits.py` before it sizes
anything: each reproducer of issue 14 (an internal error, a blow-up, a hang) is a clear error
or a quick answer now, in-process, with the exit code the CLI promises."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from conftest import SCHEDULES
from ppdsl import limits
from ppdsl.cli import main
from ppdsl.costs import CostError, parse_inline
from ppdsl.profiles import parse_profile

ZBV = str(SCHEDULES / "zbv.pps")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---- costs: non-finite, subnormal, beyond a bound -> PPS351 at the cost parser ----------------

@pytest.mark.parametrize("spec", ["F=1,F=1e-320,B=2", "F=1e-10", "F=1e308,B=1e308", "B=2e12", "comm=1e13",
                                  "bytes=1e19,bandwidth=1", "bytes=1e15,bandwidth=1e-3"])
def test_absurd_inline_costs_are_usage_errors(capsys: pytest.CaptureFixture[str], spec: str) -> None:
    for command in (["show", ZBV, "--width", "40"], ["simulate", ZBV]):
        code, out, err = run(capsys, *command, "--costs", spec)
        assert code == 2, (command, spec, err)
        assert "internal error" not in err and "--costs:" in err


def test_the_bounds_are_the_ones_in_limits() -> None:
    parse_inline(f"F={limits.MIN_COST},B={limits.MAX_COST},comm=0")
    with pytest.raises(CostError, match="smaller than") as exc:
        parse_inline(f"F={limits.MIN_COST / 2}")
    assert exc.value.code == "PPS351" and exc.value.key == "F"
    with pytest.raises(CostError, match="larger than"):
        parse_inline(f"W={limits.MAX_COST * 2}")


def test_a_header_costs_line_is_bounded_and_located(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "c.pps"
    f.write_text("pipeline ranks=1 microbatches=1\ncosts F=1 B=1e-320\nrank 0: 0F0 0B0\n")
    code, _, err = run(capsys, "simulate", str(f))
    assert code == 1
    assert f"{f}:2:11: error[PPS351]: cost `B=9.99989e-321` is smaller than 1e-09" in err


@pytest.mark.parametrize("text, message", [
    ('{"ppdsl_profile": 1, "costs": {"F": 1e400}}', "finite number"),
    ('{"ppdsl_profile": 1, "costs": {"F": ' + "9" * 400 + "}}", "finite number"),
    ('{"ppdsl_profile": 1, "costs": {"F": ' + "9" * 5000 + "}}", "too many digits"),
    ('{"ppdsl_profile": 1, "actions": [{"kind": "F", "stage": 0, "duration": ' + "9" * 400 + "}]}", "duration"),
    ('{"ppdsl_profile": 1, "actions": [{"kind": "F", "stage": 0, "duration": 1e-300}]}', "smaller than"),
    ('{"ppdsl_profile": 1, "actions": [{"kind": "F", "stage": ' + "9" * 400 + ', "duration": 1}]}', "stage"),
    ('{"ppdsl_profile": 1, "costs": {"F_s' + "9" * 5000 + '": 1}}', "unknown cost"),
    ("[" * 100_000 + "]" * 100_000, "too deeply"),
])
def test_absurd_profiles_are_located_errors(text: str, message: str) -> None:
    with pytest.raises(CostError, match=message):
        parse_profile(text)


# ---- flags ---------------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["show", ZBV, "--width", str(limits.MAX_WIDTH + 1)],
    ["show", ZBV, "--width", "19"],
    ["lint", ZBV, "--max-memory", "nan"],
    ["lint", ZBV, "--max-memory", "inf"],
    ["run", ZBV, "--steps", str(limits.MAX_STEPS + 1)],
    ["run", ZBV, "--timeout", "inf"],
    ["run", ZBV, "--seed", "-1"],
])
def test_numeric_flags_out_of_bounds_are_usage_errors(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2 and "must be" in err and "internal error" not in err


def test_header_memory_is_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "m.pps"
    f.write_text("pipeline ranks=1 microbatches=1 memory=1e300\nrank 0: 0F0 0B0\n")
    code, out, _ = run(capsys, "lint", str(f))
    assert code == 1 and "error[PPS012]: `memory` must be a positive number up to 1e+30" in out


# ---- pictures and reports: sized by the input, not by the ratio of its numbers --------------

@pytest.mark.slow
def test_terminal_picture_of_extreme_cost_ratio_is_bounded(capsys: pytest.CaptureFixture[str]) -> None:
    start = time.process_time()
    code, out, _ = run(capsys, "show", ZBV, "--costs", f"F={limits.MIN_COST},W={limits.MAX_COST}", "--width", "200")
    assert code == 0
    assert time.process_time() - start < 20
    assert len(out) < 20 * limits.MAX_PICTURE_CELLS


@pytest.mark.slow
def test_many_diagnostics_on_one_huge_row_are_linear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # issue 14: a 900 KB file of repeated `0F{0..0}` hung `show` (each excerpt re-read the row).
    f = tmp_path / "dup.pps"
    f.write_text("pipeline ranks=1 microbatches=1\nrank 0: " + "0F{0..0} " * 40_000 + "\n")
    start = time.process_time()
    code, _, err = run(capsys, "show", str(f), "--no-color")
    assert code == 1
    assert time.process_time() - start < 20
    assert "more diagnostics (`ppdsl lint --max-errors 0` lists them all)" in err


@pytest.mark.slow
def test_report_of_many_ranks_is_not_quadratic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "wide.pps"
    f.write_text("pipeline ranks=20000 microbatches=1\nuse 1f1b()\n")
    start = time.process_time()
    code, out, _ = run(capsys, "simulate", str(f))
    assert code == 0 and "19999 " in out
    assert time.process_time() - start < 30


# ---- generators: work bounded by what they output -----------------------------------------

@pytest.mark.parametrize("generator", ["zb2p", "zbv"])
def test_generators_with_many_ranks_and_one_microbatch_are_quick(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                  generator: str) -> None:
    # issue 14: `ranks=65535` + `use zb2p()` under `fmt --check` stuck in generators/greedy.py;
    # zbv padded every rank to 2*ranks-1 microbatches (4e9 steps).
    from ppdsl.expansion import parse

    start = time.process_time()
    program = parse(f"pipeline ranks=30000 microbatches=1\nuse {generator}()\n", steps_limit=limits.MAX_ACTIONS)
    assert program.ranks == 30000
    assert time.process_time() - start < 20


# ---- internal errors ------------------------------------------------------------------------

def test_carriage_return_file_is_a_syntax_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # issue 14: the 7-byte file `#\rn\nuse` raised IndexError in syntax/errors.py `_word_at`.
    f = tmp_path / "cr.pps"
    f.write_bytes(b"#\rn\nuse")
    code, out, err = run(capsys, "lint", str(f))
    assert code == 1 and "internal error" not in err
    assert out.startswith(f"{f}:2:4: error[PPS002]")
    assert f"2 | use\n" in out  # the excerpt is the line the parser counted, not the `\r` split


# ---- docs ------------------------------------------------------------------------------------

def test_the_limits_table_in_language_md_states_limits_py() -> None:
    from conftest import ROOT

    page = (ROOT / "docs" / "language.md").read_text(encoding="utf-8")
    table = page[page.index("### Limits"):page.index("## `ppdsl fmt`")]
    for number in (limits.MAX_RANKS, limits.MAX_STAGES, limits.MAX_MICROBATCHES, limits.MAX_ACTIONS,
                   limits.DEFAULT_MAX_STEPS, limits.DEFAULT_MAX_PICTURE_STEPS, limits.DEFAULT_MAX_LOWERED_STEPS,
                   limits.MAX_WIDTH, limits.MAX_STEPS, limits.MAX_PICTURE_CELLS):
        assert f"{number:,}" in table, number
    for number in (limits.MIN_COST, limits.MAX_COST, limits.MAX_QUANTITY, limits.MAX_MEMORY, limits.MAX_SECONDS):
        assert f"{number:g}".replace("e+", "e").replace("e-0", "e-").replace("e0", "e") in table, number
    assert f"{limits.MAX_FILE_BYTES // 2**20} MiB" in table


def test_a_few_actions_under_huge_stages_and_microbatches_are_refused(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # Found by scripts/fuzz.py: 4 actions under stages=microbatches=2048 took 1.2 GB in simulate.
    f = tmp_path / "sparse.pps"
    f.write_text("pipeline ranks=2 microbatches=2048 stages=2048 placement=loop\nrank 0: 0F2047 2046F3\n"
                 "rank 1: 1F0 2047B2047\n")
    for command in ("simulate", "show", "lint"):
        code, out, err = run(capsys, command, str(f))
        assert code == 1
        assert f"{f}:1:1: error[PPS015]: 2,048 stages x 2,048 microbatches are 4,194,304 (stage, microbatch) " \
               "pairs for 4 actions" in out + err


def test_a_costs_argument_too_long_for_a_file_name_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    # Found by scripts/fuzz.py: Path.exists() raised OSError (name too long) for a long `--costs`.
    code, _, err = run(capsys, "simulate", ZBV, "--costs", "I " * 3000)
    assert code == 2 and "neither costs such as" in err and "internal error" not in err and len(err) < 300


# ---- what a command takes: limits.DEFAULT_MAX_STEPS and --max-steps ------------------------

def _pps(tmp_path: Path, text: str, name: str = "in.pps") -> Path:
    f = tmp_path / name
    f.write_text(text)
    return f


READERS = ("lint", "show", "simulate", "fmt", "expand", "convert")


def _argv(command: str, f: Path, tmp_path: Path) -> list[str]:
    extra = {"fmt": ["--check"], "convert": [str(tmp_path / "out.csv")]}.get(command, [])
    return [command, str(f), *extra]


@pytest.mark.parametrize("command", READERS)
def test_a_generator_asking_for_millions_of_steps_is_refused_at_once(tmp_path: Path, command: str,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # scripts/fuzz.py: 48 bytes of `use v_min()` at 4 x 65,536 ran past 30 s in lint (1.5M steps).
    f = _pps(tmp_path, "pipeline ranks=4 microbatches=524288\nuse v_min()\n")
    start = time.process_time()
    code, out, err = run(capsys, *_argv(command, f, tmp_path))
    assert time.process_time() - start < 2
    assert code == 1 and "internal error" not in err
    limit = limits.DEFAULT_MAX_PICTURE_STEPS if command == "show" else limits.DEFAULT_MAX_STEPS
    # 4 ranks x 2 stages x 524,288 microbatches x (F, I, W): the count is exact, not an estimate.
    assert f"{f}:2:1: error[PPS015]: `v_min` makes 12,582,912 steps, more than the limit of {limit:,}" in out + err
    assert "`--max-steps 12582912` takes them" in out + err


# A 44-byte file may make 11 steps beyond any limit (one for each 4 bytes it could write out).
TINY = "pipeline ranks=1 microbatches=16\nuse 1f1b()\n"  # 32 steps
TINY_WRITES = len(TINY) // limits.WRITTEN_STEP_BYTES


@pytest.mark.parametrize("command", READERS)
def test_every_command_takes_max_steps(tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]) -> None:
    f = _pps(tmp_path, TINY)
    code, out, err = run(capsys, command, "--max-steps", str(31 - TINY_WRITES), *_argv(command, f, tmp_path)[1:])
    assert code == 1, err
    assert (f"`1f1b` makes 32 steps, more than the limit of {31 - TINY_WRITES} beyond the {TINY_WRITES} its "
            f"{len(TINY)} bytes can write out") in out + err
    code, out, err = run(capsys, command, "--max-steps", str(32 - TINY_WRITES), *_argv(command, f, tmp_path)[1:])
    assert code == 0, out + err
    assert run(capsys, command, "--max-steps", "0", str(f))[0] == 2
    assert run(capsys, command, "--max-steps", str(limits.MAX_ACTIONS + 1), str(f))[0] == 2


def test_lowering_takes_fewer_steps_by_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # scripts/fuzz.py: `expand --comms` of 65,536 ranks x 4 microbatches (524,288 steps) ran past 60 s.
    f = _pps(tmp_path, "pipeline ranks=2 microbatches=70000\nuse 1f1b()\n")  # 280,000 steps
    assert run(capsys, "expand", str(f), "-o", str(tmp_path / "x.pps"))[0] == 0
    code, out, err = run(capsys, "expand", "--comms", str(f), "-o", str(tmp_path / "y.pps"))
    assert code == 1
    assert (f"`1f1b` makes 280,000 steps, more than the limit of {limits.DEFAULT_MAX_LOWERED_STEPS:,}"
            in out + err)
    assert run(capsys, "expand", "--comms", "--max-steps", "280000", str(f), "-o", str(tmp_path / "y.pps"))[0] == 0


def test_many_ranks_count_as_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # scripts/fuzz.py: 65,536 ranks x 2 microbatches (262,144 steps) took 6 s in `show --svg`:
    # a rank costs as much as 16 steps, whatever it holds.
    f = _pps(tmp_path, "pipeline ranks=65536 microbatches=2\nuse gpipe()\n")
    start = time.process_time()
    code, out, err = run(capsys, "show", str(f), "--svg", str(tmp_path / "o.svg"))
    assert time.process_time() - start < 1
    assert code == 1
    assert (f"{f}:1:10: error[PPS015]: 65,536 ranks count as 1,048,576 steps (16 a rank: each has its tables, "
            f"lane and lines), more than the limit of {limits.DEFAULT_MAX_PICTURE_STEPS:,}") in err
    assert "`--max-steps 1048576` takes them" in err
    assert run(capsys, "lint", "--max-steps", "1048576", str(f))[0] == 0
    csv = tmp_path / "wide.csv"
    csv.write_text("0F0,0B0\n" * 40_000)  # 40,000 ranks: 640,000 as steps
    code, out, _ = run(capsys, "lint", str(csv))
    assert code == 1 and "40,000 ranks count as 640,000 steps" in out


def test_run_takes_max_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The file is refused before any process (or paddle) starts.
    f = _pps(tmp_path, TINY)
    code, out, err = run(capsys, "run", "--max-steps", str(31 - TINY_WRITES), str(f))
    assert code == 1, err
    assert f"`1f1b` makes 32 steps, more than the limit of {31 - TINY_WRITES} beyond" in out + err


def test_a_trillion_steps_are_refused_at_once_with_the_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = _pps(tmp_path, "pipeline ranks=65536 microbatches=1048576\nuse interleaved_1f1b(virtual=8)\n")
    start = time.process_time()
    code, out, _ = run(capsys, "lint", "--max-steps", str(limits.MAX_ACTIONS), str(f))
    assert time.process_time() - start < 1
    assert code == 1
    assert "`interleaved_1f1b` makes 1,099,511,627,776 steps, more than the limit of 20,000,000" in out
    assert "no command takes more than 20,000,000 steps" in out


def test_a_generator_under_the_limit_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 16 x 2000 x (F, I, W) = 96,000: refused under a limit one short of that beyond what its
    # bytes write out, taken at that limit.
    text = "pipeline ranks=16 microbatches=2000\nuse zb1p()\n"
    f, writes = _pps(tmp_path, text), len(text) // limits.WRITTEN_STEP_BYTES
    code, out, _ = run(capsys, "lint", "--max-steps", str(95_999 - writes), str(f))
    assert code == 1
    assert f"error[PPS015]: `zb1p` makes 96,000 steps, more than the limit of {95_999 - writes:,} beyond" in out
    assert run(capsys, "lint", "--max-steps", str(96_000 - writes), str(f))[0] == 0


def test_a_range_asking_for_more_than_the_limit_is_refused_where_it_is(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    f = _pps(tmp_path, "pipeline ranks=1 microbatches=70000\nrank 0: 0F{0..69999} 0B{0..69999}\n")
    code, out, _ = run(capsys, "lint", "--max-steps", "100000", str(f))
    assert code == 1
    assert f"{f}:2:22: error[PPS015]: the rows make 140,000 steps, more than the limit of 100,000" in out
    assert "`--max-steps 140000` takes them" in out


def test_a_written_out_file_is_read_whatever_the_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    big = _pps(tmp_path, "pipeline ranks=2 microbatches=20000\nuse 1f1b()\n", "big.pps")  # 80,000 steps
    assert run(capsys, "expand", "--max-steps", "79000", str(big), "-o", str(tmp_path / "x.pps"))[0] == 1
    code, _, err = run(capsys, "expand", str(big), "-o", str(tmp_path / "full.pps"))
    assert code == 0, err
    # Written out, its cost is linear in bytes the user already has: no limit refuses it.
    for limit in ("16", "50000"):
        assert run(capsys, "lint", "--max-steps", limit, str(tmp_path / "full.pps"))[0] == 0
        assert run(capsys, "expand", "--max-steps", limit, str(tmp_path / "full.pps"), "-o",
                   str(tmp_path / "again.pps"))[0] == 0
    def rows(name: str) -> list[str]:  # without the comment that names the file it came from
        return [line for line in (tmp_path / name).read_text().splitlines() if not line.startswith("#")]

    assert rows("again.pps") == rows("full.pps")


def test_a_csv_is_written_out_whatever_the_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "big.csv"
    f.write_text("\n".join(",".join(f"{r}{k}{m}" for m in range(251) for k in "FB") for r in (0, 1)) + "\n")
    for command in ("lint", "show", "simulate"):
        code, out, err = run(capsys, command, "--max-steps", "32", str(f))  # 1,004 actions, every one written
        assert code == 0, out + err


def test_the_limits_example_in_language_md(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    import re

    from conftest import ROOT

    page = (ROOT / "docs" / "language.md").read_text(encoding="utf-8")
    block = re.search(r"```console\n(\$ ppdsl lint --max-steps 100000 big\.pps\n.*?)```", page, flags=re.S)
    assert block
    source = re.search(r"where `big.pps` is `(.*?)` and `(.*?)`", page)
    assert source
    (tmp_path / "big.pps").write_text(f"{source.group(1)}\n{source.group(2)}\n")
    monkeypatch.chdir(tmp_path)
    lines = block.group(1).splitlines()
    commands = [i for i, line in enumerate(lines) if line.startswith("$ ")]
    for i, j in zip(commands, [*commands[1:], len(lines)]):
        code, out, _ = run(capsys, *lines[i][len("$ ppdsl "):].split())
        assert out.splitlines() == lines[i + 1:j], lines[i]
        assert code == (1 if lines[i + 1:j] else 0)


def test_the_public_parse_applies_every_bound() -> None:
    import ppdsl

    # check_slots: 1 action under 2,048 x 2,048 (stage, microbatch) pairs.
    with pytest.raises(ppdsl.PpsError) as info:
        ppdsl.parse("pipeline ranks=2 microbatches=2048 stages=2048 placement=loop\nrank 0: 0F2047\n")
    assert info.value.diagnostics[0].code == "PPS015"
    # DEFAULT_MAX_STEPS, or steps_limit.
    with pytest.raises(ppdsl.PpsError) as info:
        ppdsl.parse("pipeline ranks=64 microbatches=16384\nuse 1f1b()\n")
    assert info.value.diagnostics[0].message == ("`1f1b` makes 2,097,152 steps, more than the limit of 500,000 "
                                                 "beyond the 12 its 48 bytes can write out")
    text = "pipeline ranks=64 microbatches=1024\nuse 1f1b()\n"
    assert ppdsl.parse(text).action_count == 131_072
    with pytest.raises(ppdsl.PpsError):
        ppdsl.parse(text, steps_limit=131_071 - len(text) // limits.WRITTEN_STEP_BYTES)
