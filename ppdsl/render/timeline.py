"""What every picture draws: one slot per step, placed in time, with a category and a status.

Steps a stuck run never reached are laid out after the rank's last completed step, one after
another at their nominal cost, so a picture of a broken schedule still shows the whole
schedule: `status` says which slots are real ("ok"), where a rank waits forever ("stuck"),
which never ran ("unreached"), and which a diagnostic points at ("error").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from attrs import evolve, frozen

from ..costs import shares_of
from ..diagnostics import Diagnostic
from ..ir import Action, Idle, Kind, Overlap, Step, actions_of
from ..kinds import KINDS, PICTURES
from ..simulate import Simulation

# Category of a slot: its colour and its legend entry, in legend order, from the pictures of
# the table of kinds (`kinds.PICTURES`; each kind names its own, `KindRow.picture`).
CATEGORIES: dict[str, str] = {p.key: p.legend for p in PICTURES}
COLOURS: dict[str, str] = {p.key: p.colour for p in PICTURES}
# Per kind, its category (`Kind` value -> key of CATEGORIES).
_CATEGORY_OF: dict[Kind, str] = {k: k.row.picture for k in Kind}
# A token's kind name -> its label in a narrow cell (`SEND_F` -> `SF`), longest name first.
_SHORT: tuple[tuple[str, str], ...] = tuple(sorted(((r.name, r.short or r.name) for r in KINDS),
                                                   key=lambda pair: -len(pair[0])))


def category(step: Step) -> str:
    if isinstance(step, Action):
        return _CATEGORY_OF[step.kind]
    if isinstance(step, Overlap):
        return "OVERLAP"
    return "BATCH"


def lighten(hex_colour: str, amount: float) -> str:
    """Mix a colour with white: 0 keeps it, 1 is white."""
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    mix = [round(c + (255 - c) * amount) for c in (r, g, b)]
    return "#" + "".join(f"{c:02x}" for c in mix)


@frozen
class Slot:
    rank: int
    step: int
    start: float
    end: float
    text: str  # the step as written: 0F3, (0F7;7B3), <0SEND_F3 0RECV_B0>
    category: str
    stage: int
    microbatch: int | None
    chunk: int  # which of its rank's stages (0 for the first): shades interleaved schedules
    status: str  # ok | stuck | unreached | error
    note: str = ""
    copy: bool = False  # on its rank's copy lane, beside the computes (offloads, sharding collectives)

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def short(self) -> str:
        """`F3`, `SF3`, `RB0`, `0F7+7B3`, `<2>`: a label for narrow cells.

        An overlapped pair keeps its stages: `(0F7;7B3)` and `(7F7;0B3)` are different pairs."""
        if self.category == "OVERLAP":
            return "+".join(p.strip() for p in _parts(self.text))
        if self.category == "BATCH":
            return f"<{self.text.count(' ') + 1}>"
        return _short_of(self.text)


def _parts(text: str) -> list[str]:
    return text.strip("()<>").replace("OVERLAP_F_B", "").split(";")


def _short_of(token: str) -> str:
    i = 0
    while i < len(token) and token[i].isdigit():
        i += 1
    rest = token[i:]
    for long, short in _SHORT:
        if rest.startswith(long):
            return short + rest[len(long):]
    return rest


@frozen
class Timeline:
    ranks: int
    slots: tuple[Slot, ...]
    end: float  # the right edge: makespan, or beyond it when unreached steps are laid out
    makespan: float
    problems: tuple[str, ...]  # one line per stuck rank or diagnostic, for captions
    # A crop (`crop`): the time at the left edge, and the rank each lane draws (lane i holds
    # the slots whose `rank` is i); () is every rank from 0.
    origin: float = 0.0
    names: tuple[int, ...] = ()

    def rank_of(self, lane: int) -> int:
        return self.names[lane] if self.names else lane


def crop(timeline: Timeline, ranks: Sequence[int] | None = None, start: float | None = None,
         end: float | None = None) -> Timeline:
    """The part of `timeline` on `ranks` (in that order) between `start` and `end`: its slots,
    cut to the window, keep their steps and times; their `rank` is the lane that draws them."""
    lane_of = {r: i for i, r in enumerate(ranks if ranks is not None else range(timeline.ranks))}
    t0 = 0.0 if start is None else start
    t1 = timeline.end if end is None else end

    def inside(s: Slot) -> bool:  # overlaps the window (a step that takes no time: lies in it)
        return s.end > t0 and s.start < t1 if s.end > s.start else t0 <= s.start <= t1

    kept = [evolve(s, rank=lane_of[s.rank], start=max(s.start, t0), end=min(s.end, t1))
            for s in timeline.slots if s.rank in lane_of and inside(s)]
    return Timeline(len(lane_of), tuple(kept), t1, timeline.makespan, timeline.problems, t0,
                    tuple(lane_of))


def build(sim: Simulation, diagnostics: Iterable[Diagnostic] = ()) -> Timeline:
    program = sim.program
    table = sim.costs.table(program.stages, shares_of(program))
    marked: dict[tuple[int, int], str] = {}
    problems: list[str] = []
    for d in diagnostics:
        if d.rank is not None and d.step is not None:
            marked.setdefault((d.rank, d.step), f"{d.code}: {d.message}")
        problems.append(f"{d.code}: {d.message}" + (f" (rank {d.rank}, step {d.step})" if d.rank is not None else ""))
    stuck = {(w.rank, w.step): w for w in sim.waits}
    for w in sim.waits:
        who = f"rank {w.on_rank}" if w.on_rank is not None else "no rank"
        problems.append(f"rank {w.rank} stuck at step {w.step} ({w.action}): waits for `{w.needs}` from {who}")
    nominal_floor = min((c for row in table for c in row if c > 0), default=1.0)

    def nominal(step: Step) -> float:
        costs = [table[a.stage][a.kind] for a in actions_of(step) if a.stage < program.stages]
        return max([*costs, nominal_floor]) if costs else nominal_floor

    slots: list[Slot] = []
    right = sim.makespan
    for rank, row in enumerate(program.rows):
        stages = program.stages_of(rank)
        t = 0.0
        for index, step in enumerate(row):
            if type(step) is Idle:
                continue
            s, e = sim.starts[rank][index], sim.ends[rank][index]
            status = "ok"
            note = ""
            if s is None or e is None:
                status = "unreached"
                s, e = t, t + nominal(step)
                if (rank, index) in stuck:
                    status = "stuck"
                    w = stuck[(rank, index)]
                    note = f"waits for {w.needs}" + (f" from rank {w.on_rank}" if w.on_rank is not None else "")
            if (rank, index) in marked:
                status = "error" if status == "ok" else status
                note = (note + "; " if note else "") + marked[(rank, index)]
            t = max(t, e)
            first = actions_of(step)[0]
            chunk = stages.index(first.stage) if first.stage in stages else 0
            slots.append(Slot(rank, index, s, e, str(step), category(step), first.stage, first.microbatch, chunk,
                              status, note, type(step) is Action and step.kind.on_copy_lane))
        right = max(right, t)
    return Timeline(program.ranks, tuple(slots), right, sim.makespan, tuple(problems))


def kinds_in(timeline: Timeline) -> list[str]:
    """Categories present, in legend order."""
    present = {s.category for s in timeline.slots}
    return [c for c in CATEGORIES if c in present]


def colour_of(slot: Slot, chunks: int) -> str:
    base = COLOURS[slot.category]
    if chunks > 1 and slot.chunk:
        return lighten(base, 0.45 * slot.chunk / (chunks - 1))
    return base


def short_number(x: float) -> str:
    """A time or cost as the pictures label it: whole numbers plainly, others to 4 digits."""
    return str(int(x)) if x == int(x) else f"{x:.4g}"


def max_chunks(sim: Simulation) -> int:
    return max((len(sim.program.stages_of(r)) for r in range(sim.program.ranks)), default=1)
