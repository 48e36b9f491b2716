"""`--profile out.json`: measured per-action times in the simulator's profile format.

Each rank times every action of every step after the warm-up step (the first step also
agrees shapes). Compute actions keep their median duration. A send or receive blocks until
its peer is ready, so its duration mixes waiting with moving data; the fastest occurrence of
each is the closest to the transfer itself and is what the profile keeps. Rank 0 gathers
everything and writes the file (`ppdsl simulate --costs out.json` reads it).
"""

from __future__ import annotations

import re
import statistics
from typing import Any

from ..costs import profile_json
from .watchdog import Reporter

_LABEL = re.compile(r"^(\d+)([A-Z_]+?)(\d+)?$")


def local_actions(timings: dict[str, list[float]], warmup: int) -> list[dict[str, Any]]:
    """One entry per action label: kind, stage, microbatch, duration in microseconds."""
    out: list[dict[str, Any]] = []
    for label, times in timings.items():
        m = _LABEL.match(label)
        if m is None:  # an overlapped pair or a batch: the simulator costs those from parts
            continue
        kind = m.group(2)
        kept = times[warmup:] or times
        is_comm = kind.startswith(("SEND", "RECV"))
        duration = min(kept) if is_comm else statistics.median(kept)
        entry: dict[str, Any] = {"kind": kind, "stage": int(m.group(1)), "duration": round(duration * 1e6, 3)}
        if m.group(3) is not None:
            entry["microbatch"] = int(m.group(3))
        out.append(entry)
    return out


def gather_profile(sched: Any, cfg: Any, rank: int, reporter: Reporter) -> None:
    from .comm import gather_objects

    mine = local_actions(sched.timings, cfg.warmup)
    for entry in mine:
        entry["rank"] = rank
    sched.watchdog.arm("gathering the profile", "all ranks")
    gathered = gather_objects(mine)
    sched.watchdog.disarm()
    if rank != 0:
        return
    actions = [e for part in gathered for e in part]
    text = profile_json({}, unit="us", actions=actions)
    with open(cfg.profile, "w", encoding="utf-8") as f:
        f.write(text)
    reporter.send("profile", path=cfg.profile, actions=len(actions))
