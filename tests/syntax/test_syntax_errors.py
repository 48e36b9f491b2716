"""Every PPS0xx code: a small bad input, the code it must give, and where it must point."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest

from ppdsl.codes import CODES
from ppdsl.diagnostics import Diagnostic, PpsError, UsageError
from ppdsl.formats.torch_csv import read_csv, write_csv
from ppdsl.load import load_program
from ppdsl.expansion import parse

H = "pipeline ranks=2 microbatches=4\n"  # line 1 of most cases below

# (code, source text, line, column): the first diagnostic must be exactly this.
CASES = [
    ("PPS001", H + "rank 0: -1F0\n", 2, 9),
    ("PPS001", "\x01 pipeline\n", 1, 1),
    ("PPS002", H + "rank 0: ((0F0;1B0))\n", 2, 9),
    ("PPS002", H + "rank 0: 0F0,0F1\n", 2, 12),
    ("PPS002", "pipeline ranks=2 microbatches=4 =\n", 1, 33),
    ("PPS002", "pipeline ranks=2 microbatches=4 memory=0x10\n", 1, 40),  # `0x10` is not a number
    ("PPS002", "pipeline ranks=4k microbatches=4\n", 1, 16),
    ("PPS006", H + "use gpipe(\n", 2, 5),
    ("PPS002", H + "  0F0 0F1\n", 2, 3),
    ("PPS002", H + "rank 0: [ ]\n", 2, 11),
    ("PPS002", "pipline ranks=2 microbatches=4\n", 1, 1),
    ("PPS002", H + "use 1f1b\n", 2, 9),
    ("PPS003", H + "rank 0: 0X3\n", 2, 9),
    ("PPS003", H + "rank 0: F0 0F1\n", 2, 9),
    ("PPS003", H + "rank 0: 0F0 0F3x\n", 2, 13),
    ("PPS003", H + "rank 0: 0F\n", 2, 9),
    ("PPS003", H + "rank 0: 0UNSHARD1\n", 2, 9),
    ("PPS003", H + "rank 0: 0F0\n        0f1\n", 3, 9),
    ("PPS004", H + "rank 0: 0F0 0F{0..x}\n", 2, 13),
    ("PPS004", H + "rank 0: 0F{}\n", 2, 9),
    ("PPS005", H + "rank 0: [0F{0..3} 0B{0..1}]\n", 2, 10),
    ("PPS005", H + "rank 0: {0..1}F{0..2}\n", 2, 9),
    ("PPS005", H + "rank 0: (0F{0..1};1B{0..2})\n", 2, 10),
    ("PPS006", H + "rank 0: 0F{0..3\n", 2, 9),
    ("PPS006", H + "rank 0: [0F0 0B0\n", 2, 17),
    ("PPS006", H + "rank 0: 0F0 0B0]\n", 2, 13),
    ("PPS006", H + "rank 0: (0F0;1B0\n", 2, 9),
    ("PPS006", H + "rank 0: <0SEND_F0\n", 2, 9),
    ("PPS007", H + "rank 0: (0F0)\n", 2, 9),
    ("PPS007", H + "rank 0: (0F0;0SEND_F0)\n", 2, 14),
    ("PPS008", H + "rank 0: <>\n", 2, 9),
    ("PPS008", H + "rank 0: <0SEND_F0 0F0>\n", 2, 19),
    ("PPS008", H + "rank 0: <0SEND_F{0..1}>\n", 2, 10),
    ("PPS010", "", 1, 1),
    ("PPS010", "# only a comment\n\n", 1, 1),
    ("PPS010", "rank 0: 0F0\n" + H, 1, 1),
    ("PPS010", "\n\nuse gpipe()\n", 3, 1),
    ("PPS011", H + H, 2, 1),
    ("PPS011", "pipeline ranks=2 ranks=3 microbatches=4\n", 1, 18),
    ("PPS011", "pipeline ranks=2 microbatches=4 stages=3 placement=[0,1]\n", 1, 42),
    ("PPS011", "pipeline ranks=2 microbatches=4 stages=4\nuse gpipe()\n", 1, 33),
    ("PPS011", H + "costs F=1\ncosts B=2\n", 3, 1),
    ("PPS012", "pipeline microbatches=4\n", 1, 1),
    ("PPS012", "pipeline ranks=2\n", 1, 1),
    ("PPS012", "pipeline ranks=2 microbatches=4 colour=red\n", 1, 33),
    ("PPS012", "pipeline ranks=2.5 microbatches=4\n", 1, 10),
    ("PPS012", "pipeline ranks=0 microbatches=4\n", 1, 10),
    ("PPS012", "pipeline ranks=2 microbatches=4 mode=eval\n", 1, 33),
    ("PPS012", "pipeline ranks=2 microbatches=4 placement=zigzag\n", 1, 33),
    ("PPS012", "pipeline ranks=2 microbatches=4 placement=[0,5]\n", 1, 33),
    ("PPS012", "pipeline ranks=2 microbatches=4 memory=1e999\n", 1, 33),
    ("PPS012", H + "costs F=fast\n", 2, 7),
    ("PPS013", H + "rank 2: 1F0\n", 2, 6),
    ("PPS013", H + "rank 0: 0F0\nrank 1: 1F0\nrank 0: 0F1\n", 4, 6),
    ("PPS013", H + "rank " + "9" * 5000 + ": 0F0\n", 2, 6),
    ("PPS014", "pipeline ranks=2 microbatches=4 stages=2\nrank 0: 0F0 5F1\n", 2, 13),
    ("PPS014", H + "rank 0: 0F0 0F4\n", 2, 13),
    ("PPS014", H + "rank 0: 0F{2..4}\n", 2, 9),
    ("PPS014", H + "rank 0: 0F" + "9" * 5000 + "\n", 2, 9),
    ("PPS014", H + "rank 0: (0F0;1B9)\n", 2, 14),
    ("PPS014", H + "rank 0: <0SEND_F7>\n", 2, 10),
    ("PPS015", "pipeline ranks=100000 microbatches=4\n", 1, 10),
    ("PPS015", "pipeline ranks=2 microbatches=2000000\n", 1, 18),
    ("PPS015", "pipeline ranks=600 microbatches=1000000\nuse gpipe()\n", 2, 1),
    ("PPS015", "pipeline ranks=60000 microbatches=1\nuse gpipe()\n", 1, 10),  # 16 steps a rank
    ("PPS015", "pipeline ranks=64 microbatches=1024\nuse interleaved_1f1b(virtual=100000)\n", 2, 1),
    ("PPS016", "pipeline ranks=2 microbatches=1 stages=4\nrank 0: 0F0\nrank 1: 1F0\n", 1, 33),
    ("PPS016", "pipeline ranks=2 microbatches=1\nrank 0: 0F0\nrank 1: 2F0\n", 1, 10),
    ("PPS017", H + "use gpipe()\nrank 0: 0F0\n", 3, 1),
    ("PPS017", H + "rank 0: 0F0\nuse gpipe()\n", 3, 1),
    ("PPS017", H + "use gpipe()\nuse 1f1b()\n", 3, 1),
    ("PPS020", H + "use gpipes()\n", 2, 5),
    ("PPS021", H + "use gpipe(virtual=2)\n", 2, 11),
    ("PPS022", H + "use interleaved_1f1b(virtual=0)\n", 2, 22),
    ("PPS022", H + "use interleaved_1f1b(virtual=fast)\n", 2, 22),
]


def first_error(text: str) -> Diagnostic:
    with pytest.raises(PpsError) as info:
        parse(text, "bad.pps")
    assert info.value.diagnostics, "PpsError without a diagnostic"
    return info.value.diagnostics[0]


@pytest.mark.parametrize("code, text, line, column", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_bad_input_is_located(code: str, text: str, line: int, column: int) -> None:
    d = first_error(text)
    assert (d.code, d.line, d.column) == (code, line, column), d
    assert d.path == "bad.pps"
    assert d.message and len(d.message) < 300  # huge tokens are shortened, not echoed whole
    assert d.is_error


def test_unknown_generator_lists_known_ones_and_suggests() -> None:
    d = first_error(H + "use gpipes()\n")
    assert d.help is not None and "gpipe" in d.help and "1f1b" in d.help and "did you mean `gpipe`" in d.help


def test_unknown_argument_lists_valid_ones() -> None:
    d = first_error(H + "use interleaved_1f1b(chunks=2)\n")
    assert d.code == "PPS021" and d.help is not None and "virtual" in d.help


def test_zip_error_names_both_lengths() -> None:
    d = first_error(H + "rank 0: [0F{0..3} 0B{0..1}]\n")
    assert "4" in d.message and "2" in d.message


def test_caret_width_covers_the_token() -> None:
    d = first_error(H + "rank 0: 0F0 0X3\n")
    assert (d.column, d.end_column) == (13, 16)


@pytest.mark.parametrize("token", ["0F{0..999999999}", "{0..999999999}F0", "[0F{0..999999999} 0B{0..999999999}]",
                                   "0F{999999999..0}", "(0F{0..999999999};1B{0..999999999})"])
def test_billion_element_range_is_refused_fast_without_allocating(token: str) -> None:
    text = "pipeline ranks=2 microbatches=1000000 stages=2\nrank 0: " + token + "\n"
    parse("pipeline ranks=1 microbatches=1\nrank 0: 0F0\n")  # grammar loaded before measuring
    tracemalloc.start()
    start = time.process_time()  # CPU time: a shared machine's load must not fail it
    try:
        d = first_error(text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert d.code == "PPS014" and d.line == 2
    assert time.process_time() - start < 1.0
    assert peak < 5 * 2**20, f"peak {peak / 2**20:.1f} MiB"


def test_too_many_steps_in_one_row_is_refused_while_reading_it() -> None:
    def first(text: str) -> Diagnostic:
        with pytest.raises(PpsError) as info:
            parse(text, "bad.pps", steps_limit=1000)
        return info.value.diagnostics[0]

    text = "pipeline ranks=1 microbatches=600\nrank 0: 0F{0..599} 0B{0..599} 0F0\n"
    d = first(text)
    assert (d.code, d.line, d.column) == ("PPS015", 2, 20)
    # Counted to the end; the limit is the one given beyond what the file's bytes can write out.
    assert d.message == (f"the rows make 1,201 steps, more than the limit of 1,000 beyond the {len(text) // 4} its "
                         f"{len(text)} bytes can write out")
    text = "pipeline ranks=1 microbatches=600\nrank 0: [0F{0..599} 0B{0..599}]\n"
    d = first(text)
    assert (d.code, d.line) == ("PPS015", 2)
    assert d.message == (f"the zip makes 1,200 steps, more than the limit of 1,000 beyond the {len(text) // 4} its "
                         f"{len(text)} bytes can write out")


# ---- files: PPS000 and unreadable paths -------------------------------------------------

@pytest.mark.parametrize("data, line, column, message", [
    (b"pipeline ranks=2 microbatches=2\nrank 0: 0F\x000\n", 2, 11, "binary data, not a UTF-8 text file"),
    (b"pipeline ranks=1 microbatches=2\nrank 0: 0F0 0F1 0B0 0B1 # caf\xe9\n", 2, 30,
     "byte 0xe9 is not UTF-8: the file is text in another encoding"),  # Latin-1: text, not binary
])
def test_unreadable_text_is_pps000_at_the_first_bad_byte(tmp_path: Path, data: bytes, line: int, column: int,
                                                          message: str) -> None:
    f = tmp_path / "x.pps"
    f.write_bytes(data)
    with pytest.raises(PpsError) as info:
        load_program(str(f))
    d = info.value.diagnostics[0]
    assert (d.code, d.line, d.column, d.message) == ("PPS000", line, column, message)


def test_bad_utf8_is_pps000(tmp_path: Path) -> None:
    f = tmp_path / "x.pps"
    f.write_bytes(b"\xff\xfe\x00garbage" + bytes(range(256)))
    with pytest.raises(PpsError) as info:
        load_program(str(f))
    assert info.value.diagnostics[0].code == "PPS000"


@pytest.mark.parametrize("make", ["missing", "directory", "unreadable"])
def test_unreadable_path_is_a_usage_error(tmp_path: Path, make: str) -> None:
    f = tmp_path / "x.pps"
    if make == "directory":
        f.mkdir()
    elif make == "unreadable":
        f.write_text(H)
        f.chmod(0)
        try:
            f.read_bytes()
            pytest.skip("running as root: permissions are not enforced")
        except PermissionError:
            pass
    with pytest.raises(UsageError, match="x.pps"):
        load_program(str(f))


# ---- conversion codes ---------------------------------------------------------------------

@pytest.mark.parametrize("text, line, column", [
    ("0F0,0X1\n", 1, 5),
    ("0F0\n1F0,,(1F1;0B0\n", 2, 6),
    ("0F0,(0F1;0SEND_F1)OVERLAP_F_B\n", 1, 5),
    ("0F0,0UNSHARD1\n", 1, 5),
    ("0F0,0F\n", 1, 5),
    ("", 1, 1),
    (",,\n", 1, 1),
])
def test_malformed_csv_is_pps030(text: str, line: int, column: int) -> None:
    with pytest.raises(PpsError) as info:
        read_csv(text, "bad.csv")
    d = info.value.diagnostics[0]
    assert (d.code, d.path, d.line, d.column) == ("PPS030", "bad.csv", line, column)


def test_what_csv_cannot_express_is_a_pps031_warning() -> None:
    program = parse(H + "rank 0: 0F0 <0SEND_F0 0RECV_B0>\nrank 1: 1I0 1F0\n", "b.pps")
    text, warnings = write_csv(program)
    assert text == "0F0,0SEND_F0,0RECV_B0\n1I0,1F0\n"
    assert [(w.code, w.line, w.column, w.is_error) for w in warnings] == [("PPS031", 2, 13, False)]
    _, warnings = write_csv(program, "legacy")
    assert {(w.code, w.line, w.column) for w in warnings} == {("PPS031", 2, 13), ("PPS031", 3, 9)}


def test_every_language_code_has_a_failing_example_here() -> None:
    covered = {c for c, *_ in CASES} | {"PPS000", "PPS030", "PPS031"}
    family = {c for c in CODES if c.startswith("PPS0")}
    assert family - covered == set(), "add an example for each new PPS0xx code"


@pytest.mark.parametrize("token", ["{0..1}F06", "5F{0..1}", "(0F{0..1};7B0)", "[{0..1}F9 0B{0..1}]"])
def test_plain_number_beside_a_range_is_bounds_checked(token: str) -> None:
    # Found by hypothesis: `{0..1}F06` once parsed to 0F6 1F6 with microbatches=6.
    d = first_error("pipeline ranks=3 microbatches=6 stages=4 placement=loop\nrank 2: " + token + "\n")
    assert d.code == "PPS014"


@pytest.mark.parametrize("text, message, help_part", [
    (H + "  0F0\n", "actions outside a row", "rank N:"),
    ("pipline ranks=2 microbatches=4\n", "unknown statement `pipline`", "did you mean `pipeline`?"),
    (H + "rank 0: 0F0\nrnak 1: 1F0\n", "malformed action token `rnak`", "did you mean `rank`?"),
    (H + "rank 0: []\n", "an empty group `[]`", "delete the brackets"),
    ("pipeline ranks=-2 microbatches=4\n", "never negative", "count from 0"),
    (H + "use 1f1b\n", "`use 1f1b` needs its parentheses", "write `use 1f1b()`"),
])
def test_common_mistakes_get_specific_messages(text: str, message: str, help_part: str) -> None:
    d = first_error(text)
    assert message in d.message and d.help is not None and help_part in d.help, d


def test_endless_file_is_refused_without_reading_it_all(monkeypatch: pytest.MonkeyPatch) -> None:
    from ppdsl import files

    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero here")
    monkeypatch.setattr(files, "MAX_FILE_BYTES", 1 << 20)
    start = time.process_time()  # CPU time: a shared machine's load must not fail it
    with pytest.raises(UsageError, match="larger than"):
        load_program("/dev/zero")
    assert time.process_time() - start < 5


def test_a_use_line_problem_is_told_with_the_lines_read_around_it() -> None:
    # The parser notes a refused line and reads on; the `use` line, run above it, adds its own.
    for text, expected in [("use gpipe(virtual=2)\ncosts F=@\n", [("PPS021", 2, 11), ("PPS001", 3, 9)]),
                           ("costs F=@\nuse gpipe(virtual=2)\n", [("PPS001", 2, 9), ("PPS021", 3, 11)]),
                           ("use gpipe()\ncosts F=@\n", [("PPS001", 3, 9)])]:
        with pytest.raises(PpsError) as info:
            parse("pipeline ranks=4 microbatches=8\n" + text)
        assert [(d.code, d.line, d.column) for d in info.value.diagnostics] == expected, text
