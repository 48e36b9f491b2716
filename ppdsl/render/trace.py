"""Chrome trace JSON (Perfetto, chrome://tracing): one process per rank, one slice per step.

Slices carry the stage, microbatch, kind and step index in `args`; every message is a flow
arrow from the step that sends it to the step that receives it (in a program without explicit
communication, from the producing compute to the consuming one on the other rank). Times are
in microseconds as the format requires: one cost unit is drawn as one millisecond unless the
costs name a real unit (`"unit": "s"` in a profile).
"""

from __future__ import annotations

import json

from ..costs import UNITS
from ..encoding import encode
from ..ir import Kind, actions_of
from ..simulate import Simulation
from .timeline import Timeline


def render_trace(sim: Simulation, timeline: Timeline, title: str) -> str:
    scale = UNITS.get(sim.costs.unit, 1e3)
    program = sim.program
    events: list[dict[str, object]] = [
        {"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}}
        for r in range(program.ranks)
    ] + [{"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}}
         for r in range(program.ranks)]
    events += [{"ph": "M", "name": "thread_name", "pid": r, "tid": 0, "args": {"name": "steps"}}
               for r in range(program.ranks)]
    # Where each message leaves and arrives: key -> (rank, mid-time of the slice).
    leaves: dict[tuple[int, int, str], tuple[int, float]] = {}
    arrives: dict[tuple[int, int, str], tuple[int, float]] = {}
    explicit = encode(program).has_comms
    for s in timeline.slots:
        step = program.rows[s.rank][s.step]
        parts = actions_of(step)
        args: dict[str, object] = {"step": s.step, "stage": s.stage, "microbatch": s.microbatch,
                                   "kind": "+".join(a.kind.name for a in parts), "status": s.status}
        if s.note:
            args["note"] = s.note
        ts = s.start * scale
        dur = s.duration * scale
        events.append({"ph": "X", "name": s.text, "cat": s.category, "pid": s.rank, "tid": 0,
                       "ts": round(ts, 3), "dur": round(dur, 3), "args": args})
        if s.status == "unreached":
            continue
        mid = ts + dur / 2
        for a in parts:
            m = a.microbatch
            if m is None:
                continue
            k = a.kind
            if explicit:
                if k is Kind.SEND_F:
                    leaves[(a.stage + 1, m, "F")] = (s.rank, mid)
                elif k is Kind.RECV_F:
                    arrives[(a.stage, m, "F")] = (s.rank, mid)
                elif k is Kind.SEND_B:
                    leaves[(a.stage - 1, m, "B")] = (s.rank, mid)
                elif k is Kind.RECV_B:
                    arrives[(a.stage, m, "B")] = (s.rank, mid)
            else:
                pl = program.placement
                if k is Kind.F:
                    arrives[(a.stage, m, "F")] = (s.rank, mid)
                    if a.stage + 1 < program.stages and pl[a.stage + 1] != s.rank:
                        leaves[(a.stage + 1, m, "F")] = (s.rank, mid)
                elif k in (Kind.B, Kind.I):
                    arrives[(a.stage, m, "B")] = (s.rank, mid)
                    if a.stage > 0 and pl[a.stage - 1] != s.rank:
                        leaves[(a.stage - 1, m, "B")] = (s.rank, mid)
    flow = 0
    for key, (src, t0) in leaves.items():
        dst = arrives.get(key)
        if dst is None or dst[0] == src:
            continue
        flow += 1
        name = f"{'activation' if key[2] == 'F' else 'gradient'} mb {key[1]} -> stage {key[0]}"
        events.append({"ph": "s", "id": flow, "name": name, "cat": "message", "pid": src, "tid": 0, "ts": round(t0, 3)})
        events.append({"ph": "f", "bp": "e", "id": flow, "name": name, "cat": "message", "pid": dst[0], "tid": 0,
                       "ts": round(max(dst[1], t0), 3)})
    meta = {"title": title, "makespan": sim.makespan, "bubble_ratio": sim.bubble_ratio, "unit": sim.costs.unit,
            "comm_model": str(sim.comm_model), "completed": sim.completed, "problems": list(timeline.problems)}
    return json.dumps({"traceEvents": events, "displayTimeUnit": "ms", "otherData": meta}) + "\n"
