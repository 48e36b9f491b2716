"""Stage values (tensor, tuple, dict) across ranks and on one rank, and the header that
describes them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ppdsl.cli import main
from ppdsl.runtime.interpreter import values as V

paddle = pytest.importorskip("paddle")
HERE = Path(__file__).parent
MODEL = str(HERE / "helpers" / "values_model.py")


def test_split_join_and_call_follow_paddles_convention() -> None:
    form, members = V.split({"h": 1, "mask": 2})
    assert form == V.Form(V.DICT, ("h", "mask")) and form.join(members) == {"h": 1, "mask": 2}
    assert V.split((1, 2))[0].form == V.TUPLE and V.split(3) == (V.Form(V.SINGLE), [3])
    assert V.call(lambda *a, **k: (a, k), (1, 2), {"z": 0}) == ((1, 2), {"z": 0})
    assert V.call(lambda *a, **k: (a, k), {"h": 1}) == ((), {"h": 1})
    with pytest.raises(V.StageValueError, match="only string keys"):
        V.split({1: 2})


@pytest.mark.parametrize("framework", ["paddle", "torch"])
def test_a_description_round_trips_in_a_note_and_a_bad_one_is_refused(framework: str) -> None:
    pytest.importorskip(framework)
    import numpy as np

    from ppdsl.runtime.transport import messages as M
    from ppdsl.runtime.transport.messages import DTYPES, MAX_DIMS, MAX_ELEMENTS
    from ppdsl.runtime.framework import get_framework

    fw = get_framework(framework)
    h = fw.leaf(fw.from_numpy(np.ones((2, 3), dtype="float32")), True)
    mask = fw.from_numpy(np.zeros(2, dtype="int64"))
    meta = M.describe(fw, (h, mask), True, "test")
    got = M.parse_description(M.decode_note(M.encode_note(None, meta))["value"], DTYPES, MAX_DIMS,
                              MAX_ELEMENTS)
    assert got.shapes == ((2, 3), (2,)) and got.dtypes == ("float32", "int64") and got.grads == (True, False)
    with pytest.raises(V.StageValueError, match="more than the"):
        M.parse_description({"form": "single", "keys": [], "members": [[[1 << 20, 1 << 20], "float32", False]]},
                            DTYPES, MAX_DIMS, MAX_ELEMENTS)
    with pytest.raises(V.StageValueError, match="garbled"):
        M.parse_description({"form": "dict", "keys": ["a"], "members": []}, DTYPES, MAX_DIMS, MAX_ELEMENTS)
    with pytest.raises(V.StageValueError, match=f"member 1 is a str, not a {fw.tensor_type}"):
        M.describe(fw, (h, "x"), True, "test")


@pytest.mark.slow
def test_dict_values_verify_across_ranks_and_on_one_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    files = []
    for name, text in (("1f1b", "use 1f1b()"), ("zbv", "use zbv()"), ("il", "use interleaved_1f1b(virtual=2)")):
        f = tmp_path / f"{name}.pps"
        f.write_text(f"pipeline ranks=2 microbatches=4\n{text}\n")
        files.append(str(f))
    code = main(["run", *files, "--model", MODEL, "--steps", "2", "--verify", "--rtol", "1e-12", "-q", "--timeout", "30"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert len(re.findall(r"2 steps, .*verify ok", out)) == 3, out
    # On one rank a string member passes from stage 0 to stage 1 unchanged.
    monkeypatch.setenv("PPDSL_VALUES_BAD", "1")
    one = tmp_path / "one.pps"
    one.write_text("pipeline ranks=1 microbatches=2 stages=2 placement=[0,0]\nrank 0: 0F0 1F0 0F1 1F1 1B0 0B0 1B1 0B1\n")
    code = main(["run", str(one), "--model", MODEL, "--steps", "2", "--verify", "-q"])
    out, err = capsys.readouterr()
    assert code == 0 and "verify ok" in out, out + err


@pytest.mark.slow
def test_a_member_that_cannot_cross_ranks_is_refused_on_both(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PPDSL_VALUES_BAD", "1")
    f = tmp_path / "g.pps"
    f.write_text("pipeline ranks=2 microbatches=2\nuse gpipe()\n")
    code = main(["run", str(f), "--model", MODEL, "--steps", "1", "-q", "--timeout", "20"])
    _, err = capsys.readouterr()
    assert code == 1
    assert "member 'note' is a str, not a paddle.Tensor; only tensors can be sent to another rank" in err, err
    assert "timed out" not in err


@pytest.mark.slow
def test_the_grouped_path_carries_dict_values_like_the_gloo_path(tmp_path: Path) -> None:
    import json
    import sys

    from ppdsl.load import load_program
    from ppdsl.runtime.jobs.launcher import launch

    f = str(HERE / "schedules" / "2r_1f1b_batched.pps")
    outcome = launch([load_program(f)], [f], steps=0, timeout=60, quiet=True, keep_logs=str(tmp_path),
                     command=[sys.executable, str(HERE / "helpers" / "grouped_path.py")])
    assert outcome.code == 0, outcome.failure
    for rank in (0, 1):
        text = (tmp_path / f"rank{rank}.log").read_text()
        line = next((x for x in text.splitlines() if x.startswith("RESULT ")), None)
        assert line is not None, text[-2000:]
        record = json.loads(line[len("RESULT "):])
        assert record["nccl"] == record["gloo"] and record["gloo"][0]["grads"]
        assert len(record["gloo"][1]["losses"]) == (4 if rank == 1 else 0)
