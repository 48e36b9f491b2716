"""docs/runtime.md shows what `ppdsl run` prints: the memory lines and the split warning (no paddle)."""

from __future__ import annotations

from pathlib import Path

from ppdsl.cli.run_cmd import memory_line

DOC = (Path(__file__).parents[2] / "docs" / "runtime.md").read_text(encoding="utf-8")


def test_memory_lines_are_what_run_prints() -> None:
    for rank, held in ((0, 1.88), (1, 1.88)):
        line = memory_line({"rank": rank, "peak_microbatches": 2, "predicted_microbatches": 2,
                            "peak_bytes": int(held * 2**20) + 1})
        assert line + "\n" in DOC, line


def test_the_split_warning_is_the_one_the_schedule_gives() -> None:
    import inspect

    from ppdsl.runtime import schedule

    source = inspect.getsource(schedule.PipelineSchedule._switch_layers)
    assert "overrides Linear.forward, so its weight gradient " in source
    assert ("ppdsl run: warning: rank 0: stage 0: layer 0 (ScaledLinear) overrides Linear.forward, so its weight "
            "gradient cannot be deferred to W; it is computed with the input gradient in I\n") in DOC
