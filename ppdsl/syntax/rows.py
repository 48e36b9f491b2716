"""The rows of a `.pps` file: `rank N: ...` and the lines that go on it, read into steps or,
for runs of plain tokens, kept as the reader's integers (`ir.LazyRows`).

A row's line that is one plain run of canonical tokens is read whole (`scan.PlainRuns`) before
Lark runs, and Lark is given a one-character stand-in for it (`RowReader.set_aside_runs`);
other runs go through one `scan.TokenReader`; a run either refuses has an error, which
`scan.locate_run` says where. Ranges, zips, overlapped pairs and batches are made as steps; a
row's line of plain words and pairs is read before Lark too (`PairedRun`), and made into the
steps and positions Lark's items would give.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from itertools import accumulate, compress
from operator import add

from lark import Token, Tree

from .. import placement as placement_mod
from ..ir import IDLE, KIND_BY_NAME, Batch, LazyRows, Overlap, RowCodes, Rows, Segment, Span, Step, steps_from_codes
from ..limits import MAX_REPORTED_ERRORS, MAX_STAGES
from . import scan
from .reporting import Fail, Reporter


class PairedRowRefused(Exception):
    """A row set aside with overlapped pairs (`PairedRun`) that the builder cannot take as it
    was read (a number past the header's bounds, the step limit reached in it): the file is
    read again without setting such rows aside, and the careful way says what is wrong."""


class PairedRun:
    """A row's first line that is plain words and overlapped pairs of two plain words, one
    blank between each (`0F0 0SEND_F0 (0F1;3B0) 0SEND_F1`, what `expand --comms` writes for
    DualPipeV), read before Lark in two whole runs: its plain words, and its pairs' halves, by
    C-level passes over its words. `pairs` are the word indices of the pairs, `offsets` where
    each word starts in `text` (and one past the end): Lark's items are the runs of plain
    words between the pairs, and the pairs (`scan.PlainRuns.read_pairs`)."""

    __slots__ = ("column", "text", "plain", "halves", "pairs", "offsets")

    def __init__(self, column: int, text: str, plain: RowCodes, halves: RowCodes, pairs: list[int],
                 offsets: list[int]):
        self.column, self.text, self.plain, self.halves = column, text, plain, halves
        self.pairs, self.offsets = pairs, offsets

    @classmethod
    def read(cls, column: int, text: str, runs: scan.PlainRuns) -> PairedRun | None:
        """The run as plain words and pairs, or None when it is anything else (Lark reads it)."""
        words = text.split(" ")
        read = runs.read_pairs(words, ")")
        if read is None:
            return None
        is_pair, codes, halves = read
        offsets = list(map(add, accumulate(map(len, words), initial=0), range(len(words) + 1)))
        return cls(column, text, codes, halves, list(compress(range(len(words)), is_pair)), offsets)


class RowReader(Reporter):
    def __init__(self, text: str, path: str, steps_limit: int, whole_runs: bool = True, paired_rows: bool = True):
        super().__init__(text, path, steps_limit)
        self.whole_runs = whole_runs
        # line -> a row's first line of plain words and pairs, read before Lark (`PairedRun`).
        self.paired_rows = paired_rows and whole_runs
        self.paired: dict[int, PairedRun] = {}
        self.tokens: scan.TokenReader | None = None  # made by rows() for the header's bounds
        # The row being read, as the reader's integers, while every item of it is a plain run
        # read by `tokens` (None once one is not, and its steps are made): see ir.LazyRows.
        self.known: RowCodes | None = None
        self.runs = scan.PlainRuns(KIND_BY_NAME, " ", scan.IDLE_WORD)
        # line -> (column, text, codes or None) of each row's first run, read before Lark: see set_aside.
        self.set_aside: dict[int, tuple[int, str, RowCodes | None]] = {}
        self.whole: str | None = None  # the text of the item just read, when `runs` read it whole
        self.real_lines: list[str] | None = None  # the text's lines, once a stand-in is put back

    def set_aside_runs(self) -> str:
        """The text Lark is given: each `rank N: ...` line whose rest is one plain run that
        `runs` reads whole has that run replaced by a one-character word (Lark's lexer costs as
        much a token as reading it does here, and even a long word costs it ~10 ns a character).
        Such a run is exactly one ACTIONS token in the real text too, at the same place:
        canonical words with one blank between, after `:` and blanks, before blanks and the
        line's end. So the tree is the one the real text gives, with the same lines and columns
        (every node of a row ends on the next line, after its newline); only that token's text
        and length differ, and the builder takes both from `set_aside` (`real`). Rows that are
        not plain runs are left to Lark as they are."""
        text = self.text
        if not self.whole_runs:
            return text
        out: list[str] = []
        copied = counted = 0
        line = 1
        for head in _line_starts(text, "rank"):
            m = _ROW_HEAD_RE.match(text, head)
            if m is None:
                continue
            start = m.end()
            run = text[start:text.index("\n", start)].rstrip(" \t\r")
            if not run:
                continue
            line += text.count("\n", counted, start)
            counted = start
            codes = self.runs.read(run)
            self.set_aside[line] = (start - m.start() + 1, run, codes)
            paired = PairedRun.read(start - m.start() + 1, run, self.runs) if (
                codes is None and self.paired_rows and "(" in run) else None
            if paired is not None:
                self.paired[line] = paired
            if codes is not None or paired is not None:
                out.append(text[copied:start])
                out.append(_STAND_IN)
                copied = start + len(run)
        if not out:
            return text
        out.append(text[copied:])
        return "".join(out)

    def steps_in(self, item: Tree[Token] | Token, bounds: scan.Bounds) -> int:
        """The steps `item` makes, counted without making them (ScanError where it would fail)."""
        if isinstance(item, Tree):  # zip
            return sum(self.steps_in(tok, bounds) for tok in item.children)
        real = self.real(item)
        assert isinstance(real, Token)
        if real.type == "ACTIONS":
            return sum(scan.steps_in(word, bounds) for word in str(real).split())
        if real.type == "OVERLAP":
            return scan.steps_in(str(real)[1:].split(";")[0].strip(), bounds)
        return 1 if real.type == "BATCH" else scan.steps_in(str(real), bounds)

    def steps_after(self, rows: list[Tree[Token]], row: int, item: int, bounds: scan.Bounds) -> tuple[int, bool]:
        """The steps the items after `rows[row].children[item]` make, and whether some could not
        be counted (a malformed range: the parse stops at it, and the count is a lower bound)."""
        total, short = 0, False
        for r, tree in enumerate(rows[row:]):
            for child in tree.children[item + 1 if r == 0 else 1:]:
                try:
                    total += self.steps_in(child, bounds)
                except scan.ScanError:
                    short = True
        return total, short

    def rows(self, rows: list[Tree[Token]], ranks: int, microbatches: int, stages: int | None
             ) -> tuple[Rows, tuple[tuple[Segment, ...] | None, ...], tuple[Span | None, ...]]:
        # Without a stage count, any stage number is accepted and resolve_placement infers the count.
        bound_stages = stages if stages is not None else MAX_STAGES
        bounds = (bound_stages, microbatches)
        self.tokens = scan.TokenReader(KIND_BY_NAME, bound_stages, microbatches, scan.IDLE_WORD, IDLE, track_ranks=False)
        built: list[list[Step] | None] = [None] * ranks
        read: list[RowCodes | None] = [None] * ranks
        positions: list[list[Segment] | None] = [None] * ranks
        spans: list[Span | None] = [None] * ranks
        texts: list[str | None] = [None] * ranks
        total = 0
        for row_index, row in enumerate(rows):
            rank_tok = row.children[0]
            assert isinstance(rank_tok, Token)
            rank = scan.number(str(rank_tok))
            if rank >= ranks:
                self.note(self.at(rank_tok, "PPS013", f"rank {scan.shown(rank)} out of range: the header says ranks={ranks}",
                                  help=f"rows are numbered 0..{ranks - 1}"))
                continue
            if built[rank] is not None or read[rank] is not None:
                first = spans[rank]
                self.note(self.at(rank_tok, "PPS013", f"rank {rank} has a second row",
                                  help=f"its first row is on line {first.line if first else '?'}; "
                                       "a row may continue on the following lines instead"))
                continue
            steps: list[Step] = []
            pos: list[Segment] = []
            self.known = ([], [])
            for item_index, item in enumerate(row.children[1:], 1):
                self.item(item, bounds, steps, pos)
                # Checked per item, not per row: one row of ranges can ask for any number of
                # steps. Past the limit the rest is counted, not made, for the exact count.
                so_far = total + len(steps) + (len(self.known[0]) if self.known else 0)
                if so_far > self.steps_limit and isinstance(item, Token) and self.paired_at(item):
                    raise PairedRowRefused()  # where in the row the limit is reached: the careful way tells
                if so_far > self.steps_limit:
                    rest, short = self.steps_after(rows, row_index, item_index, bounds)
                    raise self.too_many(self.real(item), "the rows make", so_far + rest, short)
            if self.known is not None:  # plain runs only: kept as integers, no steps made
                total += len(self.known[0])
                read[rank] = self.known
                if len(row.children) == 2:  # one run, read whole: its text is what is printed
                    texts[rank] = self.whole
            else:
                total += len(steps)
                built[rank] = steps
            positions[rank] = pos
            spans[rank] = Span(row.meta.line, row.meta.column)
        made = [tuple(s) if s is not None else None if read[rank] is not None else () for rank, s in enumerate(built)]
        rows_out = LazyRows(made, read, texts)
        pos_out = tuple(tuple(p) if p is not None else None for p in positions)
        return rows_out, pos_out, tuple(spans)

    def real(self, item: Tree[Token] | Token) -> Tree[Token] | Token:
        """The token as the real text has it, where Lark was given a stand-in (set_aside_runs)."""
        if isinstance(item, Token) and item.type == "ACTIONS":
            aside = self.set_aside.get(item.line or 0)
            if aside is not None and aside[0] == item.column and (aside[2] is not None or self.paired_at(item)):
                return Token.new_borrow_pos("ACTIONS", aside[1], item)
        return item

    def paired_at(self, item: Token) -> PairedRun | None:
        """The row read as plain words and pairs that `item` stands in for, if it is one."""
        paired = self.paired.get(item.line or 0) if self.paired else None
        return paired if paired is not None and paired.column == item.column else None

    def paired_steps(self, paired: PairedRun, line: int, steps: list[Step], pos: list[Segment]) -> None:
        """The steps and positions of a row read as plain words and pairs: those Lark's items
        (a run of plain words, a pair each) would make, made in bulk."""
        assert self.tokens is not None
        plain = self.tokens.within(paired.plain, self.runs)
        halves = self.tokens.within(paired.halves, self.runs)
        if plain is None or halves is None:
            raise PairedRowRefused()
        self.make_steps(steps)
        made, parts = steps_from_codes(plain, IDLE), steps_from_codes(halves, IDLE)
        col, text, offsets = paired.column, paired.text, paired.offsets
        first = at = half = 0  # the run's first word, the plain steps and halves made so far
        for p in [*paired.pairs, len(offsets) - 1]:  # each pair, then the row's end
            if p > first:  # the run of plain words before it
                pos.append(Segment(len(steps), line, col + offsets[first], text[offsets[first]:offsets[p] - 1]))
                steps.extend(made[at:at + p - first])  # type: ignore[arg-type]
                at += p - first
            if p < len(offsets) - 1:
                pos.append(Segment(len(steps), line, col + offsets[p]))
                steps.append(Overlap((parts[half], parts[half + 1])))  # type: ignore[arg-type]
                half += 2
            first = p + 1

    def item(self, item: Tree[Token] | Token, bounds: scan.Bounds, steps: list[Step], pos: list[Segment]) -> None:
        if isinstance(item, Tree):  # zip
            self.make_steps(steps)
            self.zip(item, bounds, steps, pos)
            return
        line, col = item.line or 1, item.column or 1
        try:
            if item.type == "ACTIONS":
                paired = self.paired_at(item)
                if paired is not None:
                    self.paired_steps(paired, line, steps, pos)
                    return
                self.plain_run(item, line, col, bounds, steps, pos)
                return
            self.make_steps(steps)  # a range, an overlapped pair or a batch: the row is made of steps
            if item.type == "RANGED":
                pos.append(Segment(len(steps), line, col))
                steps.extend(scan.expand_ranged(str(item), 0, bounds))
            elif item.type == "OVERLAP":
                pos.append(Segment(len(steps), line, col))
                steps.extend(self.overlap(str(item), bounds))
            else:  # BATCH
                pos.append(Segment(len(steps), line, col))
                steps.append(self.batch(str(item), bounds))
        except scan.ScanError as err:
            self.note(self.error(err.code, err.message, line, col + err.offset, err.width, err.help))

    def run_codes(self, item: Token, line: int, col: int) -> tuple[str, RowCodes | None]:
        """The run's real text and its integers, read by the fast readers (whole, else word by
        word); None when they refuse it (it has an error to report)."""
        aside = self.set_aside.get(line)
        if aside is not None and aside[0] == col and (aside[2] is not None or len(aside[1]) == len(item)):
            text, whole = aside[1], aside[2]  # the run read before Lark (set aside, or not read whole)
        else:
            text = str(item)
            whole = self.runs.read(text) if self.whole_runs else None
        fast = self.tokens.within(whole, self.runs) if whole is not None and self.tokens is not None else None
        self.whole = text if fast is not None else None
        if fast is None and self.tokens is not None:
            fast = self.tokens.codes(text.split())
        return text, fast

    def plain_run(self, item: Token, line: int, col: int, bounds: scan.Bounds, steps: list[Step],
                  pos: list[Segment]) -> None:
        """A run of plain tokens joins its row in one of three forms: kept as integers while
        the row has only such runs (`known`), made into steps once the row has others, or read
        token by token by the error locator when the fast readers refuse it."""
        if "\n" in item:  # pragma: no cover - the terminal cannot span lines
            raise AssertionError
        text, fast = self.run_codes(item, line, col)
        if fast is None:  # something to report: token by token, every bad one told
            self.make_steps(steps)
            pos.append(Segment(len(steps), line, col, text))
            for err in scan.locate_run(text, bounds, steps, IDLE, MAX_REPORTED_ERRORS):  # type: ignore[arg-type]
                self.note(self.error(err.code, err.message, line, col + err.offset, err.width, err.help))
        elif self.known is None:  # the row already has steps: these join them
            pos.append(Segment(len(steps), line, col, text))
            steps.extend(steps_from_codes(fast, IDLE))  # type: ignore[arg-type]
        else:
            pos.append(Segment(len(self.known[0]), line, col, text))
            if self.known[0]:
                self.known[0].extend(fast[0])
                self.known[1].extend(fast[1])
            else:  # the row's first run: its lists are the reader's fresh ones
                self.known = fast

    def make_steps(self, steps: list[Step]) -> None:
        """From here on the row is built as steps: the plain runs read before become steps."""
        if self.known is not None:
            steps.extend(steps_from_codes(self.known, IDLE))  # type: ignore[arg-type]
            self.known = None

    def overlap(self, text: str, bounds: scan.Bounds) -> list[Overlap]:
        inner_end = text.index(")")
        inner = text[1:inner_end]
        parts = inner.split(";")
        if len(parts) != 2 or not all(p.strip() for p in parts):
            raise scan.ScanError("PPS007", f"an overlapped pair holds exactly two actions: `{text}`", 0, len(text),
                                 help="write it as `(0F7;7B3)`: a forward and a backward of two stages")
        offset = 1
        expanded = []
        for part in parts:
            stripped = part.strip()
            lead = len(part) - len(part.lstrip())
            actions = scan.expand_word(stripped, offset + lead, bounds)
            for a in actions:
                if not a.kind.is_compute:
                    raise scan.ScanError("PPS007", f"`{a}` in an overlapped pair is not a compute action",
                                         offset + lead, len(stripped), help="only F, B, I and W overlap")
            expanded.append((stripped, offset + lead, actions))
            offset += len(part) + 1
        scan.zip_lengths(expanded)
        return [Overlap((a, b)) for a, b in zip(expanded[0][2], expanded[1][2])]

    def batch(self, text: str, bounds: scan.Bounds) -> Batch:
        words = scan.split_words(text[1:-1])
        if not words:
            raise scan.ScanError("PPS008", "an empty batch `<>`", 0, len(text),
                                 help="a batch holds one or more SEND_*/RECV_* actions, e.g. `<0SEND_F3 0RECV_B0>`")
        parts = []
        for word, offset in words:
            if "{" in word:
                raise scan.ScanError("PPS008", f"ranges are not allowed inside a batch: `{word}`", offset + 1, len(word))
            action = scan.parse_word(word, offset + 1, bounds)
            if not action.kind.is_comm:
                raise scan.ScanError("PPS008", f"`{word}` in a batch is not a send or receive", offset + 1, len(word),
                                     help="only SEND_F, RECV_F, SEND_B and RECV_B can be fused into a batch")
            parts.append(action)
        return Batch(tuple(parts))

    def zip(self, node: Tree[Token], bounds: scan.Bounds, steps: list[Step], pos: list[Segment]) -> None:
        members: list[tuple[str, int, list[Step]]] = []
        member_pos: list[tuple[int, int]] = []  # (line, column) of each zipped member
        line = node.meta.line
        for tok in node.children:
            assert isinstance(tok, Token)
            col = tok.column or 1
            try:
                if tok.type == "ACTIONS":
                    for word, offset in scan.split_words(str(tok)):
                        members.append((word, col + offset, [IDLE] if word == scan.IDLE_WORD else list(scan.expand_word(word, 0, bounds))))
                        member_pos.append((line, col + offset))
                elif tok.type == "RANGED":
                    members.append((str(tok), col, list(scan.expand_ranged(str(tok), 0, bounds))))
                    member_pos.append((line, col))
                else:
                    members.append((str(tok), col, list(self.overlap(str(tok), bounds))))
                    member_pos.append((line, col))
            except scan.ScanError as err:
                self.note(self.error(err.code, err.message, tok.line or line, col + err.offset, err.width, err.help))
                return
            if sum(len(items) for _, _, items in members) > self.steps_limit:
                raise self.too_many(tok, "the zip makes", self.steps_in(node, bounds))
        try:
            scan.zip_lengths(members)
        except scan.ScanError as err:
            self.note(self.error(err.code, err.message, line, members[0][1], 1, err.help))
            return
        for i in range(len(members[0][2])):
            for (_, _, items), p in zip(members, member_pos):
                pos.append(Segment(len(steps), p[0], p[1]))
                steps.append(items[i])

    def resolve_placement(self, explicit: tuple[int, ...] | None, rows: Rows, ranks: int,
                          stages: int | None, spans: dict[str, Span]) -> tuple[tuple[int, ...], int]:
        """The stage -> rank map and the stage count, inferred from the rows where the header gives neither."""
        if explicit is not None:
            # header_placement made it one rank per stage (and set the count when the header had none).
            return explicit, len(explicit)
        seen = placement_mod.stage_ranks(rows)
        if stages is None:
            stages = max(seen) + 1 if seen else ranks
        missing = [s for s in range(stages) if s not in seen]
        if missing and seen:
            # Without `placement=`, a stage's rank is the row its actions are on; a stage with
            # no actions anywhere has none. (A file with no actions at all is left on `loop`.)
            s = spans.get("stages") or spans["ranks"]
            listed = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
            raise Fail(self.at_span(s, "PPS016", f"stage{'s' if len(missing) > 1 else ''} {listed} appear{'' if len(missing) > 1 else 's'} "
                                     f"in no row, so {'their ranks are' if len(missing) > 1 else 'its rank is'} unknown",
                                     help="give every stage an action in some row, or say `placement=loop`, `placement=v` or list the ranks"))
        # A stage found on several rows is left on its first rank; the checker reports the rest.
        return tuple(min(seen[s]) if s in seen else s % ranks for s in range(stages)), stages


# The start of a row's line (as `rank INT ":"` lexes; other spellings are left to Lark), and
# what a run set aside is replaced with: one ACTIONS word.
_ROW_HEAD_RE = re.compile(r"rank[ \t]+[0-9]+[ \t]*:[ \t]*")
_STAND_IN = "_"


def _line_starts(text: str, word: str) -> Iterator[int]:
    """Where the lines that start with `word` start (str.find: a regex `^` tries every character)."""
    if text.startswith(word):
        yield 0
    at = text.find("\n" + word)
    while at >= 0:
        yield at + 1
        at = text.find("\n" + word, at + 1)
