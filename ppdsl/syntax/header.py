"""The header of a `.pps` file (`pipeline ranks=... microbatches=...`), its `costs` line and
a `use` line's arguments: options read, bounded and checked, every problem located."""

from __future__ import annotations

import math

from attrs import frozen
from lark import Token, Tree

from .. import placement as placement_mod
from ..diagnostics import Diagnostic
from ..ir import Span
from ..limits import MAX_MEMORY, MAX_MICROBATCHES, MAX_RANKS, MAX_STAGES, STEPS_PER_RANK, ranks_past, steps_help
from ..wording import did_you_mean, plural
from . import scan
from .handoff import UseLine, Value
from .reporting import Fail, Reporter

HEADER_OPTIONS = {
    "ranks": "number of ranks (processes); required",
    "microbatches": "number of microbatches per step; required",
    "stages": "number of model stages (default: from the placement, the rows, or ranks)",
    "placement": "stage -> rank map: loop, v, or a list such as [0,1,1,0]",
    "memory": "limit on live activations per rank, in microbatches of a rank's activations (checked by `ppdsl lint`)",
    "mode": "train (default) or inference (forward only)",
}


@frozen
class Header:
    """A header as checked: its sizes within their bounds, a placement that fits them."""

    values: dict[str, Value]
    spans: dict[str, Span]  # where the header writes each option
    span: Span  # the whole header
    ranks: int
    microbatches: int
    stages: int | None  # None: from the rows (or the generator)
    placement: tuple[int, ...] | None  # the header's, when it gives one
    mode: str
    memory: float | None
    costs: tuple[tuple[str, float], ...]
    costs_line: Span | None  # where the `costs` line starts, when there is one
    cost_spans: dict[str, Span]  # where that line writes each key


def value_of(tree: Tree[Token]) -> Value:
    kind = tree.data
    if kind == "int_value":
        digits = str(tree.children[0]).lstrip("0") or "0"
        # Too long for int() (and for any limit): inf, which options() refuses as too large.
        return int(digits) if len(digits) <= 4000 else math.inf
    if kind == "float_value":
        return float(str(tree.children[0]))
    if kind == "name_value":
        return str(tree.children[0])
    return tuple(scan.number(str(c)) for c in tree.children)  # list_value


class HeaderReader(Reporter):
    def read_header(self, header: Tree[Token], costs: Tree[Token] | None) -> Header:
        values, spans = self.options(header, HEADER_OPTIONS, "header")
        for required in ("ranks", "microbatches"):
            if required not in values:
                raise Fail(self.at(header, "PPS012", f"the header needs `{required}=N`",
                                    help="e.g. `pipeline ranks=4 microbatches=8`"))
        ranks = self.int_option(values, spans, "ranks", 1, MAX_RANKS)
        microbatches = self.int_option(values, spans, "microbatches", 1, MAX_MICROBATCHES)
        stages = self.int_option(values, spans, "stages", 1, MAX_STAGES)
        assert ranks is not None and microbatches is not None
        too_many_ranks = ranks_past(ranks, self.steps_limit, self.limit_words)
        if too_many_ranks is not None:
            raise Fail(self.at_span(spans["ranks"], "PPS015", too_many_ranks,
                                     help=steps_help(STEPS_PER_RANK * ranks)))
        mode = values.get("mode", "train")
        if mode not in ("train", "inference"):
            raise Fail(self.at_span(spans["mode"], "PPS012", f"`mode` is train or inference, not `{mode}`"))
        memory = values.get("memory")
        if memory is not None and (isinstance(memory, (str, tuple)) or not 0 < memory <= MAX_MEMORY):
            s = spans["memory"]
            raise Fail(self.error("PPS012", f"`memory` must be a positive number up to {MAX_MEMORY:g}, not `{memory}`",
                                   s.line, s.column))
        explicit_placement = self.header_placement(values, spans, ranks, stages)
        if explicit_placement is not None and stages is None:
            stages = len(explicit_placement)
        cost_items: tuple[tuple[str, float], ...] = ()
        cspans: dict[str, Span] = {}
        if costs is not None:
            cvalues, cspans = self.options(costs, None, "costs")
            for key, value in cvalues.items():
                if isinstance(value, (str, tuple)):
                    s = cspans[key]
                    raise Fail(self.error("PPS012", f"cost `{key}` must be a number, not `{value}`", s.line, s.column))
            cost_items = tuple((k, float(v)) for k, v in cvalues.items())  # type: ignore[arg-type]
        return Header(values, spans, Span(header.meta.line, header.meta.column, header.meta.end_column), ranks,
                      microbatches, stages, explicit_placement, str(mode),
                      float(memory) if memory is not None else None, cost_items,
                      None if costs is None else Span(costs.meta.line, costs.meta.column), cspans)

    def options(self, node: Tree[Token], allowed: dict[str, str] | None, what: str) -> tuple[dict[str, Value], dict[str, Span]]:
        values: dict[str, Value] = {}
        spans: dict[str, Span] = {}
        unknown: list[Diagnostic] = []  # every misspelt option is told, not only the first
        for opt in node.children:
            if not isinstance(opt, Tree) or opt.data != "option":
                continue
            name_tok, value_tree = opt.children
            assert isinstance(name_tok, Token) and isinstance(value_tree, Tree)
            name = str(name_tok)
            if allowed is not None and name not in allowed:
                unknown.append(self.at(name_tok, "PPS012", f"unknown {what} option `{name}`",
                                       help=did_you_mean(name, allowed) + "valid options: " + ", ".join(allowed)))
                continue
            if name in values:
                raise Fail(self.at(name_tok, "PPS011", f"{what} option `{name}` given twice"))
            value = value_of(value_tree)
            if isinstance(value, (int, float)) and not abs(value) <= 1e300:
                raise Fail(self.at(opt, "PPS012", f"{what} option `{name}` is too large to be a number",
                                    help="write an ordinary decimal number such as 1.5 or 2e3"))
            values[name] = value
            spans[name] = Span(opt.meta.line, opt.meta.column, opt.meta.end_column)
        if unknown:  # (what the misspelt options would have said, `ranks=` above all, is not asked for)
            raise Fail(*unknown)
        return values, spans

    def int_option(self, values: dict[str, Value], spans: dict[str, Span], name: str, lo: int, hi: int) -> int | None:
        if name not in values:
            return None
        value = values[name]
        span = spans[name]
        if not isinstance(value, int) or isinstance(value, bool):
            raise Fail(self.at_span(span, "PPS012", f"`{name}` must be a whole number, not `{value}`"))
        if not lo <= value <= hi:
            raise Fail(self.at_span(span, "PPS015" if value > hi else "PPS012",
                                     f"`{name}={scan.shown(value)}` is outside {lo}..{hi}"))
        return value

    def use_line(self, use: Tree[Token]) -> UseLine:
        name = use.children[0]
        assert isinstance(name, Token)
        line, column = name.line or 1, name.column or 1
        args, arg_spans = self.options(use, None, "generator")
        meta = use.meta
        return UseLine(str(name), Span(line, column, column + len(name)), tuple(args.items()), arg_spans,
                       Span(meta.line, meta.column, meta.end_column if meta.end_line == meta.line else None))

    def header_placement(self, values: dict[str, Value], spans: dict[str, Span], ranks: int,
                         stages: int | None) -> tuple[int, ...] | None:
        if "placement" not in values:
            return None
        value = values["placement"]
        s = spans["placement"]
        if isinstance(value, tuple):
            bad = [r for r in value if r >= ranks]
            if not value or bad:
                raise Fail(self.error("PPS012", f"placement {list(value)} names rank {bad[0] if bad else '?'} "
                                       f"but there {'is' if ranks == 1 else 'are'} {plural(ranks, 'rank')}" if value else "placement is empty",
                                       s.line, s.column, help="list one rank per stage, each below `ranks`"))
            if stages is not None and len(value) != stages:
                raise Fail(self.error("PPS011", f"placement lists {plural(len(value), 'stage')} but the header says stages={stages}",
                                       s.line, s.column))
            return value
        if value not in placement_mod.NAMED:
            raise Fail(self.error("PPS012", f"unknown placement `{value}`", s.line, s.column,
                                   help="use loop, v, or a list of ranks such as [0,1,1,0]"))
        count = stages if stages is not None else (2 * ranks if value == "v" else ranks)
        return placement_mod.NAMED[str(value)](ranks, count)
