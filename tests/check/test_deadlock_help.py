"""PPS210's help names one move that breaks the deadlock, and the moved file lints clean of it."""

from __future__ import annotations

import re

import pytest

from conftest import ROOT
from ppdsl.check import check, moves
from ppdsl.diagnostics import Diagnostic
from ppdsl.expansion import parse

BOTH_RECEIVE_FIRST = ("pipeline ranks=2 microbatches=2\n"
                      "rank 0: 0F0 0SEND_F0 0F1 0RECV_B0 0SEND_F1 0B0 0RECV_B1 0B1\n"
                      "rank 1: 1RECV_F0 1F0 1B0 1RECV_F1 1SEND_B0 1F1 1B1 1SEND_B1\n")
PADDLE = (ROOT / "tests" / "check" / "data" / "paddle_1f1b_2ranks.pps").read_text()


def deadlock(text: str, model: str = "rendezvous") -> Diagnostic:
    (d,) = [d for d in check(parse(text, "d.pps"), model) if d.is_error]
    assert d.code == "PPS210", d
    return d


def moved(text: str, help_text: str) -> str:
    """The file with the help's move made, as a user would make it."""
    lines = text.splitlines(keepends=True)
    put = re.search(r"put `(\S+)` (before|after) `(\S+)` on rank (\d+)", help_text)
    if put:
        step, where, anchor, rank = put.groups()
        i = next(i for i, line in enumerate(lines) if line.startswith(f"rank {rank}:"))
        head, _, body = lines[i].partition(":")
        words = body.split()
        words.remove(step)
        at = words.index(anchor) + (where == "after")
        words.insert(at, step)
        lines[i] = f"{head}: {' '.join(words)}\n"
        return "".join(lines)
    batch = re.search(r"write rank (\d+)'s `(<[^>]*>)` as `(<[^>]*>)`", help_text)
    assert batch, help_text
    rank, old, new = batch.groups()
    i = next(i for i, line in enumerate(lines) if line.startswith(f"rank {rank}:"))
    lines[i] = lines[i].replace(old, new, 1)
    return "".join(lines)


def test_both_sides_receive_first_gets_the_move_and_not_the_circle() -> None:
    d = deadlock(BOTH_RECEIVE_FIRST)
    assert d.help is not None
    assert d.help.startswith("put `0SEND_F1` before `0RECV_B0` on rank 0: with that one move the program runs to "
                             "the end under `rendezvous` (checked)"), d.help
    assert "receives first" not in d.help and "expand --comms" not in d.help
    # No model completes the original (each side receives first), so none is named.
    assert "completes under" not in d.help
    assert [x for x in check(parse(moved(BOTH_RECEIVE_FIRST, d.help))) if x.is_error] == []


def test_a_batch_is_regrouped_and_the_next_deadlock_is_a_later_one() -> None:
    d = deadlock(PADDLE)
    assert d.help is not None and "write rank 0's `<0SEND_F1 0RECV_B0>` as `<0RECV_B0 0SEND_F1>`" in d.help
    assert "completes under `grouped` and `buffered`" in d.help and "lint again" in d.help
    after = deadlock(moved(PADDLE, d.help))
    assert after.step is not None and d.step is not None and after.step > d.step
    assert "`0SEND_F1`" not in after.message


def test_following_the_help_again_and_again_ends_clean() -> None:
    text = PADDLE
    for _ in range(4):
        found = [d for d in check(parse(text, "p.pps")) if d.is_error]
        if not found:
            break
        (d,) = found
        assert d.code == "PPS210" and d.help is not None
        text = moved(text, d.help)
    assert [d for d in check(parse(text, "p.pps")) if d.is_error] == []


def test_under_grouped_the_move_is_checked_under_grouped() -> None:
    d = deadlock(BOTH_RECEIVE_FIRST, "grouped")
    assert d.help is not None and "under `grouped` (checked)" in d.help
    assert [x for x in check(parse(moved(BOTH_RECEIVE_FIRST, d.help)), "grouped") if x.is_error] == []


def test_without_a_move_it_says_so_and_where_expand_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(moves, "MAX_TRIES", 0)  # no move may be tried: the words for "none found"
    d = deadlock(BOTH_RECEIVE_FIRST)
    assert d.help is not None and d.help.startswith("none of the moves of one step on the cycle tried breaks it")
    assert "delete the sends and receives and let `ppdsl expand --comms` place them" in d.help
