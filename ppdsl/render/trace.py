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
from ..encoding import INPUT_FROM_STAGE, PEER_OF_KIND, encode
from ..ir import Kind, actions_of
from ..simulate import Simulation
from .timeline import Timeline

COPY_TID = 1  # the thread of a rank's copy lane (offloads and reloads run beside its steps, thread 0)

# A message is keyed by the stage it goes to, its microbatch and what it carries ("F": an
# activation, going up the stages; "B": a gradient, going down), from the rule's tables:
# per send, (the step to the stage it goes to, what); per receive, what;
_SENDS: dict[Kind, tuple[int, str]] = {Kind(k): (step, "F" if step > 0 else "B")
                                       for k, (step, _) in PEER_OF_KIND.items() if Kind(k).is_send}
_RECEIVES: dict[Kind, str] = {Kind(k): "F" if step < 0 else "B" for k, (step, _) in PEER_OF_KIND.items()
                              if Kind(k).is_recv}
# in a program without sends and receives, per compute that takes its input from a neighbouring
# stage, (the step to the stage its own output goes to, what it takes and hands on).
_HANDED_ON: dict[Kind, tuple[int, str]] = {Kind(k): (-step, "F" if step < 0 else "B")
                                           for k, (step, _) in INPUT_FROM_STAGE.items()}


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
    copy_lanes: set[int] = set()  # the ranks whose copy lane (offloads, reloads: a thread of its own) is named
    for s in timeline.slots:
        step = program.rows[s.rank][s.step]
        parts = actions_of(step)
        args: dict[str, object] = {"step": s.step, "stage": s.stage, "microbatch": s.microbatch,
                                   "kind": "+".join(a.kind.name for a in parts), "status": s.status}
        if s.note:
            args["note"] = s.note
        ts = s.start * scale
        dur = s.duration * scale
        tid = COPY_TID if s.copy else 0
        if tid and s.rank not in copy_lanes:
            copy_lanes.add(s.rank)
            events.append({"ph": "M", "name": "thread_name", "pid": s.rank, "tid": tid, "args": {"name": "copy"}})
        events.append({"ph": "X", "name": s.text, "cat": s.category, "pid": s.rank, "tid": tid,
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
                if k in _SENDS:
                    hop, what = _SENDS[k]
                    leaves[(a.stage + hop, m, what)] = (s.rank, mid)
                elif k in _RECEIVES:
                    arrives[(a.stage, m, _RECEIVES[k])] = (s.rank, mid)
            elif k in _HANDED_ON:
                hop, what = _HANDED_ON[k]
                arrives[(a.stage, m, what)] = (s.rank, mid)
                to = a.stage + hop
                if 0 <= to < program.stages and program.placement[to] != s.rank:
                    leaves[(to, m, what)] = (s.rank, mid)
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
