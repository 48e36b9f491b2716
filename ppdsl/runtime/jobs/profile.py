"""`--profile out.json`: measured per-action times in the simulator's profile format.

Each rank times every action of every step after the warm-up step (the first step also
agrees shapes). Compute actions keep their median duration, per stage and kind.

A send or receive blocks until its peer is ready, so its own duration mixes waiting with
moving data. The simulator's rendezvous model says a pair completes a message time after the
later of its two sides is posted, so that is what is measured: for each pair of a step,
(the later end) - (the later start), from both ranks' clocks (`time.perf_counter`, one clock
for all processes of a machine), and its median over steps. Ranks on different machines do
not share a clock: then each side keeps its fastest occurrence, the closest to the transfer
alone. Rank 0 gathers everything and writes the file (`ppdsl simulate --costs out.json`
reads it), with each rank's measured memory next to the checker's prediction.
"""

from __future__ import annotations

import re
import socket
import statistics
from typing import Any

from ...encoding import encode
from ...ir import KIND_BY_NAME, Kind
from ...kinds import TABLE
from ...links import peer_of
from ...profiles import profile_json
from ...memory import Sizes, peak_bytes, peak_stage_activations
from .watchdog import Reporter

_LABEL = re.compile(r"^(\d+)([A-Z_]+?)(\d+)?$")


def local_actions(timings: dict[str, list[float]], warmup: int,
                  started: dict[str, list[float]] | None = None) -> list[dict[str, Any]]:
    """One entry per action label: kind, stage, microbatch, duration in microseconds.

    With `started`, a send or receive also carries its measured spans (`_spans`, seconds) for
    `pair_messages`; alone, it keeps its fastest occurrence."""
    out: list[dict[str, Any]] = []
    for label, times in timings.items():
        m = _LABEL.match(label)
        if m is None:  # an overlapped pair or a batch: the simulator costs those from parts
            continue
        kind = m.group(2)
        kept = times[warmup:] or times
        is_comm = kind.startswith(("SEND", "RECV"))
        duration = min(kept) if is_comm else statistics.fmean(kept)
        entry: dict[str, Any] = {"kind": kind, "stage": int(m.group(1)), "duration": round(duration * 1e6, 3)}
        if m.group(3) is not None:
            entry["microbatch"] = int(m.group(3))
        if is_comm and started is not None and label in started:
            starts = started[label]
            skip = warmup if len(times) > warmup else 0
            entry["_spans"] = [(t0, t0 + d) for t0, d in zip(starts[skip:], times[skip:])]
        out.append(entry)
    return out


def pair_messages(actions: list[dict[str, Any]], pipeline: int | None = None) -> None:
    """Each send/receive's duration becomes its pair's median (later end - later start). With
    `pipeline` (its ranks), a job of several pipelines (shards of each stage, `--fsdp`): pairs
    within one, whose global ranks are `rank // pipeline` alike."""
    def group(a: dict[str, Any]) -> int:
        return int(a["rank"]) // pipeline if pipeline else 0

    index = {(a["kind"], a["stage"], a.get("microbatch"), group(a)): a for a in actions if "_spans" in a}
    for a in index.values():
        kind, stage = peer_of(KIND_BY_NAME[a["kind"]], a["stage"])
        other = index.get((Kind(kind).name, stage, a.get("microbatch"), group(a)))
        if other is None:
            continue
        pairs = list(zip(a["_spans"], other["_spans"]))
        if pairs:
            a["duration"] = round(statistics.fmean(max(x[1], y[1]) - max(x[0], y[0]) for x, y in pairs) * 1e6, 3)
    for a in actions:
        a.pop("_spans", None)


def stage_sizes(sched: Any, optimizer: Any = None) -> dict[int, tuple[int, int, int, int, int, int]]:
    """Per stage of this rank, bytes: (activation, kept, state, input, output, gathered), as
    `memory.Sizes` counts them. State is the stage's parameters, their gradients and the
    optimizer's state for them (a sharded stage's: its shard's); gathered, what its whole
    weights take while gathered."""
    fw, live = sched.fw, sched.memory
    out: dict[int, tuple[int, int, int, int, int, int]] = {}
    for s, layer in sched.layers.items():
        params = [p for _, p in fw.named_parameters(layer)]
        grads = [g for g in map(fw.grad_of, params) if g is not None]
        state = live.bytes_of(fw, params) + live.bytes_of(fw, grads)
        if optimizer is not None:
            state += fw.optimizer_state_bytes(optimizer, params)
        out[s] = (live.activation.get(s, 0), live.kept.get(s, 0), state, live.input.get(s, 0), live.output.get(s, 0),
                  live.gathered.get(s, 0))
    return out


def gather_profile(sched: Any, cfg: Any, rank: int, reporter: Reporter, file: int = 0, optimizer: Any = None) -> None:
    from ..transport.comm import gather_objects

    mine = local_actions(sched.timings, cfg.warmup, sched.started)
    for entry in mine:
        entry["rank"] = rank
    sizes = stage_sizes(sched, optimizer)
    memory = {"rank": rank, "peak_microbatches": sched.memory.peak_graphs,
              "predicted_microbatches": peak_stage_activations(sched.program)[sched.plan.rank],
              "peak_bytes": sched.memory.peak_bytes, "state_bytes": sum(size[2] for size in sizes.values()),
              "weight_gradients": {str(s): path for s, path in sorted(sched.split_paths.items())},
              **({"offloaded_bytes": {str(s): n for s, n in sorted(sched.memory.offloaded.items())}}
                 if sched.memory.offloaded else {}),
              "_sizes": sizes, "_pipeline_rank": sched.plan.rank}
    # The CPU has no allocator peak to read; a GPU's is the framework's own count.
    allocator = sched.fw.allocator_peak_bytes() if sched.fw.device.is_gpu else None
    if allocator is not None:
        memory["allocator_peak_bytes"] = allocator
        memory["device"] = sched.fw.device.name
    sched.watchdog.arm("gathering the profile", "all ranks")
    gathered = gather_objects(sched.fw, (socket.gethostname(), mine, memory))
    sched.watchdog.disarm()
    if rank != 0:
        return
    actions = [e for _, part, _ in gathered for e in part]
    if len({host for host, _, _ in gathered}) == 1:
        pair_messages(actions, sched.plan.ranks)
    for a in actions:
        a.pop("_spans", None)
    memories = [m for _, _, m in gathered]
    measured = _sizes_of(sched.program, memories)
    predicted = peak_bytes(sched.program, measured).peak
    for m in memories:  # a rank's prediction is its pipeline rank's (shards of a stage hold alike)
        m["predicted_bytes"] = round(predicted[m.pop("_pipeline_rank")])
    # The interpreter runs an offload or reload on its rank's own thread, between computes.
    costs = {"copy_lane": 0.0} if not encode(sched.program).kinds.isdisjoint(TABLE.copy) else {}
    text = profile_json(costs, unit="us", actions=actions, memory=memories, sizes=measured)
    with open(cfg.profile, "w", encoding="utf-8") as f:
        f.write(text)
    reporter.send("profile", file=file, path=cfg.profile, actions=len(actions), memory=memories)


def _sizes_of(program: Any, memories: list[dict[str, Any]]) -> Sizes:
    """Every rank's stage sizes as one `Sizes` of the program's stages (each taken off its entry)."""
    per_stage: dict[int, tuple[int, int, int, int, int, int]] = {}
    for m in memories:
        per_stage.update(m.pop("_sizes"))
    columns = list(zip(*(per_stage.get(s, (0,) * 6) for s in range(program.stages))))
    activation, kept, state, inputs, outputs, gathered = (list(c) for c in columns) if columns else ([],) * 6
    return Sizes(activation, kept, state, inputs if any(inputs) else (), outputs if any(outputs) else (),
                 gathered if any(gathered) else ())
