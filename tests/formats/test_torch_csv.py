"""PyTorch's schedule CSV: the three real files from PyTorch's test suite, both dialects."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest

from ppdsl.diagnostics import PpsError
from ppdsl.formats.torch_csv import CurrentDialect, LegacyDialect, detect_dialect, read_csv, write_csv
from ppdsl.ir import Kind, Overlap
from ppdsl.expansion import parse
from ppdsl.syntax.printer import print_program

# file -> (dialect, ranks, stages, microbatches, placement)
FILES = {
    "dualpipev_4rank_10mb.csv": ("current", 4, 8, 10, (0, 1, 2, 3, 3, 2, 1, 0)),
    "zb1p_2rank_2stagep_compute.csv": ("legacy", 2, 4, 8, (0, 1, 0, 1)),
    "zb1p_2rank_2stagep_comms.csv": ("legacy", 2, 4, 8, (0, 1, 0, 1)),
}


def as_current(legacy_text: str) -> str:
    """The legacy file rewritten by hand-rule: BW -> B, and B -> I where a W follows."""
    weights = set(re.findall(r"(\d+)W(\d+)", legacy_text))

    def cell(m: re.Match[str]) -> str:
        stage, kind, mb = m.groups()
        if kind == "BW":
            return f"{stage}B{mb}"
        return f"{stage}I{mb}" if (stage, mb) in weights else m.group(0)

    return re.sub(r"(?<![A-Z_\d])(\d+)(BW|B)(\d+)", cell, legacy_text)


@pytest.mark.parametrize("name", FILES)
def test_real_file_reads_with_its_shape(vectors: Path, name: str) -> None:
    dialect, ranks, stages, microbatches, placement = FILES[name]
    text = (vectors / name).read_text()
    assert detect_dialect(text.replace("\n", ",").split(",")).name == dialect
    p = read_csv(text, name)
    assert (p.ranks, p.stages, p.microbatches, p.placement) == (ranks, stages, microbatches, placement)
    # Every stage runs every microbatch forward once, and backward once (B, or I then W).
    for s in range(stages):
        acts = [a for _, _, a in p.actions() if a.stage == s]
        assert sorted(a.microbatch for a in acts if a.kind is Kind.F) == list(range(microbatches))
        full = [a.microbatch for a in acts if a.kind is Kind.B]
        inputs = [a.microbatch for a in acts if a.kind is Kind.I]
        weights = [a.microbatch for a in acts if a.kind is Kind.W]
        assert sorted(inputs) == sorted(weights)
        assert sorted(full + inputs) == list(range(microbatches))


@pytest.mark.parametrize("name", FILES)
def test_real_file_round_trips_through_pps_exactly(vectors: Path, name: str, tmp_path: Path) -> None:
    dialect = FILES[name][0]
    text = (vectors / name).read_text()
    program = read_csv(text, name)
    pps = print_program(program)
    again = parse(pps)
    assert again == program
    back, warnings = write_csv(again, dialect)
    assert warnings == [] and back == text
    current, _ = write_csv(again, "current")
    assert current == (text if dialect == "current" else as_current(text))
    assert read_csv(current, "current.csv") == program


def test_dualpipev_pairs_keep_pytorch_spelling(vectors: Path) -> None:
    p = read_csv((vectors / "dualpipev_4rank_10mb.csv").read_text())
    pairs = [s for row in p.rows for s in row if isinstance(s, Overlap)]
    assert len(pairs) >= 20 and str(pairs[0]) == "(0F7;7B3)"
    assert "(0F7;7B3)OVERLAP_F_B" in write_csv(p)[0]


def test_legacy_b_without_w_is_a_full_backward() -> None:
    p = read_csv("0F0,0F1,0B0,0B1,0W1\n")
    assert [str(a) for _, _, a in p.actions()] == ["0F0", "0F1", "0B0", "0I1", "0W1"]


def test_dialect_is_forced() -> None:
    text = "0F0,0B0,0W0\n"
    assert [a.kind for _, _, a in read_csv(text).actions()] == [Kind.F, Kind.I, Kind.W]  # detected legacy
    assert [a.kind for _, _, a in read_csv(text, dialect="current").actions()] == [Kind.F, Kind.B, Kind.W]
    with pytest.raises(PpsError) as info:
        read_csv("0F0,0I0,0W0\n", "x.csv", dialect="legacy")
    d = info.value.diagnostics[0]
    assert (d.code, d.line, d.column) == ("PPS030", 1, 5) and "legacy" in d.message


def test_forcing_current_on_a_legacy_file_points_at_the_first_bw(vectors: Path) -> None:
    text = (vectors / "zb1p_2rank_2stagep_comms.csv").read_text()
    with pytest.raises(PpsError) as info:
        read_csv(text, "c.csv", dialect="current")
    d = info.value.diagnostics[0]
    assert (d.code, d.line, d.column) == ("PPS030", 1, text.index("2BW0") + 1)


def test_idle_cells_empty_rows_and_crlf() -> None:
    p = read_csv("0F0,,0B0\r\n\r\n,1F0\r\n")
    assert [len(r) for r in p.rows] == [3, 0, 2]
    assert write_csv(p)[0] == "0F0,,0B0\n\n,1F0\n"
    assert CurrentDialect.name == "current" and LegacyDialect.name == "legacy"


# ---- PyTorch itself loads what we write ---------------------------------------------------------

def _torch_load(path: Path, ranks: int, stages: int, microbatches: int, comms: bool) -> tuple[dict[int, list[Any]], dict[int, int]]:
    """Run PyTorch's own `_load_csv` (its validation included) without a process group."""
    from torch.distributed.pipelining import schedules

    cls = schedules._PipelineScheduleRuntime if comms else schedules.PipelineScheduleMulti
    obj: Any = cls.__new__(cls)  # only the attributes `_load_csv` reads
    obj.pipeline_order = {}
    obj.pp_group_size, obj._num_stages, obj._n_microbatches, obj._stages = ranks, stages, microbatches, []
    if comms:
        obj._load_csv(str(path), format="compute_comms")
        return obj.pipeline_order_with_comms, obj.stage_index_to_group_rank
    obj._load_csv(str(path))
    return obj.pipeline_order, obj.stage_index_to_group_rank


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
@pytest.mark.parametrize("name", FILES)
def test_pytorch_loads_our_current_dialect_output(vectors: Path, name: str, tmp_path: Path) -> None:
    _, ranks, stages, microbatches, placement = FILES[name]
    program = parse(print_program(read_csv((vectors / name).read_text(), name)))
    out = tmp_path / "out.csv"
    out.write_text(write_csv(program, "current")[0])
    order, mapping = _torch_load(out, ranks, stages, microbatches, comms="comms" in name)
    assert mapping == dict(enumerate(placement))
    for rank, row in enumerate(program.rows):
        assert [str(a) if a is not None else "_" for a in order[rank]] == \
            [f"{s}OVERLAP_F_B" if isinstance(s, Overlap) else str(s) for s in row]
