"""Scanning action tokens: the readers that turn runs of tokens into integers or actions.

A run of canonical tokens and idle ones, `0F0 _ 0B0` (or a CSV row's cells), is read whole by
`PlainRuns`, before Lark sees the row (see `rows.RowReader.set_aside_runs`): a few C-level
string passes over the run and two dictionary lookups a word, into the integers `ir.RowCodes`.
Lark hands over the other runs of tokens (`0F0 0F1 0B0 ...`). `TokenReader` turns a run (or a
CSV row's cells) into actions without a regex or a Python frame per token: the run is split by
`str.split`, each word cut at its trailing digits by `str.rstrip` mapped over the run, and the
`[stage][kind]` prefix and the microbatch digits looked up in dictionaries that learn (parse
and bound) each distinct string once; `ir.make_actions` then makes the row's actions in one go,
or, through `codes`, the run stays as (stage-kind, microbatch) integers (`ir.RowCodes`) that the
encoding and the printer read and `ir.LazyRows` turns into actions only when a pass asks.
A run neither of them accepts has an error: `locate_run`, the one reader that locates errors,
reads it token by token (`parse_word`) and says where each bad one is. Ranges (`0F{0..3}`), zips, overlapped pairs and batches are rare and always go the
careful way. Every problem is raised as a `ScanError` holding the offset inside the text it
was given, so the caller can turn it into a file:line:col diagnostic.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import compress, repeat
from operator import is_, not_
from typing import TypeVar, cast

from ..gather import gather
from ..ir import KIND_BITS, KIND_BY_NAME, KIND_MASK, Action, Kind, RowCodes, make_action, steps_from_codes
from ..limits import MAX_MICROBATCHES, MAX_STAGES

# The token syntax, stated once: [stage][kind][microbatch], the microbatch left out for a
# stage-only kind, and `_` for an idle step. Every reader below matches these pieces (the
# grammar's ACTIONS terminal only finds where a run of words starts and ends).
_STAGE, _KIND, _MICRO = r"(\d+)", r"([A-Z_]+)", r"(\d*)"
IDLE_WORD = "_"
_ONE_TOKEN_RE = re.compile(_STAGE + _KIND + _MICRO + r"\Z")
_PREFIX_RE = re.compile(_STAGE + _KIND + r"\Z")  # a token without its microbatch digits
# A run for the reader that locates errors: a token, an idle word, or anything else (a bad word).
TOKEN_RE = re.compile(_STAGE + _KIND + _MICRO + r"(?=\s|\Z)|(" + IDLE_WORD + r")(?=\s|\Z)|(\S+)")
_DIGITS = "0123456789"  # what ends a token: its microbatch
_PART_RE = re.compile(r"(\d+|\{[^}]*\})([A-Za-z_]+)(\d+|\{[^}]*\})?\Z")
_RANGE_RE = re.compile(r"\{\s*(\d+)\s*\.\.\s*(\d+)\s*\}\Z")


# Numbers longer than this are beyond every limit; converting them could even fail
# (Python refuses int() of more than 4300 digits), so they become HUGE instead.
HUGE = 10**18


def number(digits: str) -> int:
    """A run of decimal digits as an int, or HUGE when it is longer than any limit."""
    significant = digits.lstrip("0")
    if not significant:
        return 0
    return int(significant) if len(significant) <= 18 else HUGE


def shown(value: int) -> str:
    return "(a number of more than 18 digits)" if value >= HUGE else str(value)


class ScanError(Exception):
    def __init__(self, code: str, message: str, offset: int = 0, width: int = 1, help: str | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.offset = offset
        self.width = width
        self.help = help


KIND_LIST = ", ".join(KIND_BY_NAME)


# PyTorch's legacy CSV spelling of a full backward (where its `B` is this language's `I`).
LEGACY_FULL_BACKWARD = "BW"


def _bad_kind(word: str, kind: str, offset: int) -> ScanError:
    if kind == LEGACY_FULL_BACKWARD:
        full = word.replace(LEGACY_FULL_BACKWARD, "B", 1)
        hint = (f"`BW` is PyTorch's legacy spelling of a full backward: write `{_short(full)}`; a legacy "
                "PyTorch CSV converts whole with `ppdsl convert FILE.csv FILE.pps` (its `B` becomes `I`)")
    elif kind.upper() in KIND_BY_NAME:
        hint = f"did you mean `{_short(word.replace(kind, kind.upper(), 1))}`? kinds are upper case"
    else:
        hint = f"an action is [stage][kind][microbatch] with kind one of {KIND_LIST}, e.g. `0F3`"
    return ScanError("PPS003", f"unknown action kind `{kind}` in `{_short(word)}`", offset, len(word), help=hint)


def _upper_case_hint(word: str) -> str | None:
    """`did you mean ...` for a token whose kind is written in lower case (`1b0`, `0send_f1`)."""
    m = _ONE_TOKEN_RE.match(word.upper())
    if m is None or m.group(2) not in KIND_BY_NAME or word == word.upper():
        return None
    return f"did you mean `{_short(word.upper())}`? kinds are upper case"


def _check_microbatch(word: str, kind: Kind, has_mb: bool, offset: int) -> None:
    if kind.stage_only and has_mb:
        raise ScanError("PPS003", f"`{kind.name}` takes no microbatch: `{_short(word)}`", offset, len(word),
                        help=f"write it as `{word[: len(word) - len(word.lstrip('0123456789'))]}{kind.name}`")
    if not kind.stage_only and not has_mb:
        raise ScanError("PPS003", f"`{_short(word)}` has no microbatch", offset, len(word),
                        help=f"write the microbatch after the kind, e.g. `{word}0`")


# Bounds checking lives with scanning: a token outside the header's shape is reported where it
# stands, and a huge range is refused before it is expanded.
Bounds = tuple[int, int]  # (stages, microbatches)


def _bounds_error(what: str, value: int, limit: int, word: str, offset: int) -> ScanError:
    return ScanError(
        "PPS014",
        f"{what} {shown(value)} out of range in `{_short(word)}`: the header allows 0..{limit - 1}",
        offset,
        len(word),
        help=f"raise `{'stages' if what == 'stage' else 'microbatches'}` in the header or fix the token",
    )


def _short(word: str) -> str:
    return word if len(word) <= 40 else word[:37] + "..."






Value = TypeVar("Value")


def looked_up(table: dict[str, Value], keys: list[str], learn: Callable[[set[str]], bool]) -> list[Value] | None:
    """Each key's value in `table`, in one C-level pass; the keys not seen before are learned
    (parsed and bounded into `table` by `learn`) once; None when they cannot be."""
    try:
        return gather(table, keys)
    except KeyError:
        if not learn(set(keys).difference(table)):
            return None
        return gather(table, keys)


class TokenReader:
    """Plain tokens -> steps, for one file: what each distinct prefix and number string means
    is learned once, bounded by `stages` and `microbatches`, and then only looked up.

    `idle` is the word of an idle step (`_` in .pps, the empty cell in a CSV). `stage_ranks`
    (with `track_ranks`) and `max_micro` collect the shape the tokens imply, for readers that
    infer it.
    """

    def __init__(self, names: Mapping[str, Kind], stages: int, microbatches: int, idle: str, idle_step: object,
                 track_ranks: bool = True):
        self.names, self.stages, self.microbatches = names, stages, microbatches
        self.idle_step = idle_step
        # prefix -> its stage and kind in one int (`stage << KIND_BITS | kind`, what the encoding
        # and the printer start from); the idle word maps to None.
        self.sk_of: dict[str, int | None] = {idle: None}
        self.micro_of: dict[str, int | None] = {"": None}  # "": no microbatch
        # stage-kind -> whether it takes no microbatch (the idle word: None -> True)
        self.bare: dict[int | None, bool] = {None: True}
        self.stage_only_sks: set[int] = set()
        self.track_ranks = track_ranks
        self.stage_ranks: dict[int, int] = {}  # stage -> first rank it was read on (with track_ranks)
        self.max_micro = -1  # the largest microbatch learned (each was in a row that was read:
        # a row refused after learning some goes the careful way, which reads or refuses it whole)

    def _learn_prefix(self, prefix: str) -> bool:
        m = _PREFIX_RE.match(prefix)
        if m is None:
            return False
        kind = self.names.get(m.group(2))
        stage = number(m.group(1))
        if kind is None or stage >= self.stages:
            return False
        sk = self.sk_of[prefix] = stage << KIND_BITS | kind
        self.bare[sk] = kind.stage_only
        if kind.stage_only:
            self.stage_only_sks.add(sk)
        return True

    def _learn_micro(self, digits: str) -> bool:
        value = number(digits)
        if value >= self.microbatches:
            return False
        self.micro_of[digits] = value
        if value > self.max_micro:
            self.max_micro = value
        return True

    def within(self, codes: RowCodes, runs: PlainRuns, rank: int = 0) -> RowCodes | None:
        """A run `runs` read, if it is inside this reader's bounds (else None: the careful way
        says which token is not), noted as `codes` notes it. Every number `runs` learned was
        in a run it read (`PlainRuns.read`): when the largest are in bounds, so is this run."""
        if runs.top_stage < self.stages and runs.top_micro < self.microbatches:
            self.max_micro = max(self.max_micro, runs.top_micro)
        else:  # some run of the file is out of bounds (an error): is it this one?
            sks = [sk for sk in codes[0] if sk is not None]
            mbs = [mb for mb in codes[1] if mb is not None]
            # A code's stage is its high bits: the largest code holds the largest stage.
            if (sks and max(sks) >> KIND_BITS >= self.stages) or (mbs and max(mbs) >= self.microbatches):
                return None
            self.max_micro = max([self.max_micro, *mbs])
        if self.track_ranks:
            stage_ranks = self.stage_ranks
            distinct = set(codes[0])
            distinct.discard(None)
            for sk in cast("set[int]", distinct):
                if sk >> KIND_BITS not in stage_ranks:
                    stage_ranks[sk >> KIND_BITS] = rank
        return codes

    def steps(self, words: list[str], rank: int = 0) -> list[object] | None:
        """The steps the words spell, or None when some word is not a plain in-bounds token
        (the caller then takes the careful path, which says which and where)."""
        codes = self.codes(words, rank)
        return None if codes is None else steps_from_codes(codes, self.idle_step)

    def codes(self, words: list[str], rank: int = 0) -> RowCodes | None:
        """What `steps` would make, as the reader's integers (`ir.RowCodes`): no Action object.
        Two lookups a word once every prefix and number is known; the sets of distinct ones
        are made only when a word is new."""
        prefixes = list(map(str.rstrip, words, repeat(_DIGITS)))
        micros = list(map(str.removeprefix, words, prefixes))
        sks = looked_up(self.sk_of, prefixes, lambda new: all(map(self._learn_prefix, new)))
        mbs = looked_up(self.micro_of, micros, lambda new: all(map(self._learn_micro, new))) if sks is not None else None
        if sks is None or mbs is None:
            return None
        # A word has a microbatch exactly when its kind takes one: a stage-only kind and the
        # idle word have none. Checked whole-row only when the row has such a word.
        if None in mbs or None in sks or (self.stage_only_sks and not self.stage_only_sks.isdisjoint(sks)):
            if list(map(is_, mbs, repeat(None))) != gather(self.bare, sks):
                return None
        if self.track_ranks:
            stage_ranks = self.stage_ranks
            for sk in set(sks):
                if sk is not None and sk >> KIND_BITS not in stage_ranks:
                    stage_ranks[sk >> KIND_BITS] = rank
        return sks, mbs


class PlainRuns:
    """A whole run of canonical `[stage][kind][microbatch]` words and idle ones, joined by one
    separator (`0F0 _ 0B0`, or a CSV row's cells, `0F0,,0B0`) -> the reader's integers
    (`ir.RowCodes`), with no Python step per word, and no bounds but the limits' (the caller
    checks its own, `TokenReader.within`).

    A separator is put after every letter that ends a kind taking a microbatch (one
    `str.replace` a letter) and after the name of a stage-only kind present (`3UNSHARD`), and
    the run split there: each word falls apart into its prefix and its microbatch (empty for a
    stage-only word), and the pieces alternate. An idle word is first replaced by IDLE_MARK, a
    prefix whose microbatch piece is empty. Only canonical pieces are known (`12F`, not `012F`;
    `3`, not `03`), each learned (parsed, bounded) once. The run is accepted when every even
    piece is a known prefix, every odd one a known microbatch, there are two pieces a word, and
    the empty microbatches are where the prefix is idle or stage-only (as many as idle words,
    when no stage-only word is there). Then each word is exactly one prefix and one microbatch
    (a piece that is not a word's last ends in a letter, so no odd piece is such; so every
    even piece starts a word, no word has three pieces, and with two a word on average each
    has two), the codes are what `TokenReader.codes` makes of the same words, and the text is
    what the printer writes for them. Anything else (a range, two blanks, a leading zero, a
    `~`) returns None and goes the word-by-word way.
    """

    def __init__(self, names: Mapping[str, Kind], separator: str, idle: str):
        self.names = names
        self.separator = separator
        self.ends, self.repairs, self.repair_marks = cut_letters(names, separator)
        # A stage-only word (`3UNSHARD`) whose name ends in no letter of `ends` is cut after its
        # whole name: its microbatch piece is empty (one ending in such a letter is cut there).
        self.stage_only_names = [name for name, kind in names.items() if kind.stage_only and name[-1] not in self.ends]
        # Letters one of which is in every stage-only name and none in another (`H`, `G`): a
        # row without them has no stage-only word, told by a search of the row a letter rather
        # than one a name (None: no such letters, every row is looked at word by word).
        self.stage_only_marks = marking({name for name, kind in names.items() if kind.stage_only}, names)
        self.bare: dict[int | None, bool] = {None: True}  # stage-kind -> whether it takes no microbatch
        # An idle word between separators, and what it is replaced with: the mark and an
        # empty microbatch once cut (`~F` + separator), read as the idle step's (None, None).
        self.idle_word, self.marked = separator + idle + separator, separator + IDLE_MARK + self.ends[0] + separator
        self.grows = len(self.marked) - len(self.idle_word)  # (each replacement lengthens the text by this)
        self.sk_of: dict[str, int | None] = {IDLE_MARK + self.ends[0]: None}  # "12F" -> 12 << KIND_BITS | Kind.F
        self.micro_of: dict[str, int | None] = {}  # "3" -> 3
        self.micro_or_idle: dict[str, int | None] = {"": None}  # the same and the idle word's empty one
        self.top_stage = self.top_micro = -1  # the largest of each learned

    def _learn_prefixes(self, new: set[str]) -> bool:
        """Learn every new prefix of a run, or none: what is learned was in a run of words
        that each fell apart into a prefix and a microbatch (see `_learn_micros`)."""
        learned: dict[str, int | None] = {}
        bare: dict[int | None, bool] = {}
        for prefix in new:
            m = _PREFIX_RE.match(prefix)
            kind = self.names.get(m.group(2)) if m else None
            if m is None or kind is None or not canonical(m.group(1)) or int(m.group(1)) >= MAX_STAGES:
                return False
            learned[prefix] = sk = int(m.group(1)) << KIND_BITS | kind
            bare[sk] = kind.stage_only
        self.sk_of.update(learned)
        self.bare.update(bare)
        # (the largest code holds the largest stage: a code's stage is its high bits)
        self.top_stage = max([self.top_stage, *(sk >> KIND_BITS for sk in cast("dict[str, int]", learned).values())])
        return True

    def _learn_micros(self, new: set[str]) -> bool:
        """Learn every new microbatch of a run, or none. All or none, because `top_micro` must
        be a microbatch some accepted run has: the runs learned from have every even piece a
        prefix (which ends in a letter that is cut after, so no word ends there) and every odd
        one digits or nothing (so each is a word's end): each word is then one of each."""
        learned: dict[str, int | None] = {}
        for digits in new:
            if not canonical(digits) or int(digits) >= MAX_MICROBATCHES:
                return False
            learned[digits] = int(digits)
        self.micro_of.update(learned)
        self.micro_or_idle.update(learned)
        self.top_micro = max([self.top_micro, *cast("dict[str, int]", learned).values()])
        return True

    def read(self, text: str) -> RowCodes | None:
        if IDLE_MARK in text:
            return None
        separator = self.separator
        padded = separator + text + separator
        idle = 0
        if self.idle_word in padded:
            # Twice: the first pass leaves every other of adjacent idle words (their
            # separators overlap).
            padded = padded.replace(self.idle_word, self.marked).replace(self.idle_word, self.marked)
            idle = (len(padded) - len(text) - 2 * len(separator)) // self.grows
        cut = padded[len(separator):len(padded) - len(separator)]
        for letter in self.ends:  # (str.translate to two characters is ten times slower)
            cut = cut.replace(letter, letter + separator)
        # A letter of `ends` inside a name (`RECV_F`'s `R`) was cut too: such a cut is the only
        # separator between two letters, and is taken out again.
        if self.repair_marks is None or any(map(text.__contains__, self.repair_marks)):
            for cut_pair, pair in self.repairs:
                while cut_pair in cut:
                    cut = cut.replace(cut_pair, pair)
        # Whether a stage-only word may be there.
        bare = self.stage_only_marks is None or any(map(text.__contains__, self.stage_only_marks))
        if bare:
            for name in self.stage_only_names:
                if name in cut:
                    cut = cut.replace(name, name + separator)
        pieces = cut.split(separator)
        if len(pieces) != 2 * (text.count(separator) + 1):
            return None
        prefixes, micros = pieces[0::2], pieces[1::2]
        sks = looked_up(self.sk_of, prefixes, self._learn_prefixes)
        table = self.micro_or_idle if idle or bare else self.micro_of
        mbs = looked_up(table, micros, self._learn_micros) if sks is not None else None
        if sks is None or mbs is None:
            return None
        if bare:  # a word has no microbatch exactly where it is idle or of a stage-only kind
            if list(map(is_, mbs, repeat(None))) != gather(self.bare, sks):
                return None
        elif idle and mbs.count(None) != idle:
            return None
        return sks, mbs


    def read_pairs(self, words: list[str], end: str) -> tuple[list[bool], RowCodes, RowCodes] | None:
        """A run of plain words and overlapped pairs (`(0F1;3B0)` + `end`: `)` in `.pps`,
        `)OVERLAP_F_B` in a CSV), read in two whole runs with C-level passes over its words:
        (which words are pairs, the plain words' integers, the pairs' halves', two a pair).
        None when it has no pair, a pair written otherwise (a bracket or `;` more, a blank),
        or a half that is idle, stage-only or not a compute action (F, I, W, B)."""
        is_pair = list(map(str.startswith, words, repeat("(")))
        pairs = list(compress(words, is_pair))
        if not pairs or not all(map(str.endswith, pairs, repeat(end))) or {*map(str.count, pairs, repeat(";"))} != {1}:
            return None
        joined = self.separator.join(pairs)
        if joined.count("(") != len(pairs) or joined.count(")") != len(pairs):
            return None  # a bracket inside a pair
        halves = self.read(joined.replace(end, "").replace("(", "").replace(";", self.separator))
        if halves is None or None in halves[1] or any(sk is None or sk & KIND_MASK > Kind.B for sk in set(halves[0])):
            return None
        plain = list(compress(words, map(not_, is_pair)))
        codes = self.read(self.separator.join(plain)) if plain else ([], [])
        return None if codes is None else (is_pair, codes, halves)


def cut_letters(names: Mapping[str, Kind], separator: str) -> tuple[list[str], list[tuple[str, str]],
                                                                   list[str] | None]:
    """How `PlainRuns.read` cuts a run's words at the end of their kind: (the letters that end
    a kind taking a microbatch, cut after; the pairs of letters inside a name whose first is
    such a letter, as cut and as written, put back together; letters one of which is in every
    row that needs a pair put back, or None when no such few letters tell)."""
    whole = [name for name, kind in names.items() if kind.row.read_whole]
    ends = sorted({name[-1] for name in whole if not names[name].stage_only})
    # (a name not read whole that holds such a letter is cut there too: its rows fall apart
    # into pieces no prefix matches, and are read word by word)
    pairs = sorted({name[i:i + 2] for name in whole for i in range(len(name) - 1) if name[i] in ends})
    repairs = [(pair[0] + separator + pair[1], pair) for pair in pairs]
    return ends, repairs, marking({name for name in names if any(pair in name for pair in pairs)}, names)


def marking(some: set[str], names: Iterable[str]) -> list[str] | None:
    """A few letters, each in no name outside `some`, one of which is in every name of `some`
    (a row holding none of them holds no word of `some`); None when there are none such."""
    rest = set("".join(name for name in names if name not in some))
    left = [set(name) - rest for name in some]
    if not all(left):
        return None
    marks: list[str] = []
    while left:  # the letter in the most names not yet told, and again
        letter = max(sorted(set().union(*left)), key=lambda c: sum(c in own for own in left))
        marks.append(letter)
        left = [own for own in left if letter not in own]
    return marks


# Stands for an idle word in `PlainRuns.read`: a character no token has (a run holding one is
# not read whole).
IDLE_MARK = "~"

_CANONICAL_NUMBER_RE = re.compile(r"(?:0|[1-9][0-9]{0,17})\Z")


def canonical(digits: str) -> bool:
    """Whether a number is written as the printer writes it: no leading zero, within `HUGE`."""
    return _CANONICAL_NUMBER_RE.match(digits) is not None


def locate_run(text: str, bounds: Bounds, out: list[object], idle: object, limit: int) -> list[ScanError]:
    """The reader that locates errors, for a run the fast readers refused: each token
    (`TOKEN_RE`) read alone by `parse_word`, its step appended to `out`; every bad one (at
    most `limit`) becomes a `ScanError` at its offset, so a file's errors are all told. Not
    on the hot path: a run comes here only when it has something to report."""
    found: list[ScanError] = []
    for m in TOKEN_RE.finditer(text):
        if m.group(4):
            out.append(idle)
            continue
        try:
            out.append(parse_word(m.group(0), m.start(), bounds))
        except ScanError as err:
            found.append(err)
            if len(found) >= limit:
                break
    return found


def parse_word(word: str, offset: int, bounds: Bounds) -> Action:
    """One plain token, fully checked."""
    m = _ONE_TOKEN_RE.match(word)
    if m is None:
        raise ScanError(
            "PPS003",
            f"malformed action token `{_short(word)}`",
            offset,
            len(word),
            help=_upper_case_hint(word)
            or "an action is [stage][kind][microbatch], e.g. `0F3`, `2SEND_B1`, `1UNSHARD`; `_` is idle",
        )
    kind = KIND_BY_NAME.get(m.group(2))
    if kind is None:
        raise _bad_kind(word, m.group(2), offset)
    _check_microbatch(word, kind, bool(m.group(3)), offset)
    stage = number(m.group(1))
    micro = number(m.group(3)) if m.group(3) else None
    if stage >= bounds[0]:
        raise _bounds_error("stage", stage, bounds[0], word, offset)
    if micro is not None and micro >= bounds[1]:
        raise _bounds_error("microbatch", micro, bounds[1], word, offset)
    return make_action(stage, kind, micro)


def _range(text: str, word: str, offset: int, limit: int, what: str) -> range | int:
    """`{a..b}` as a range (descending when a > b), or a plain number."""
    if not text.startswith("{"):
        value = number(text)
        if value >= limit:
            raise _bounds_error(what, value, limit, word, offset)
        return value
    m = _RANGE_RE.match(text)
    if m is None:
        raise ScanError("PPS004", f"bad range `{_short(text)}` in `{_short(word)}`", offset, len(word),
                        help="a range is `{a..b}` with whole numbers a and b, both included")
    a, b = number(m.group(1)), number(m.group(2))
    for value in (a, b):
        if value >= limit:
            raise _bounds_error(what, value, limit, word, offset)
    return range(a, b + 1) if a <= b else range(a, b - 1, -1)


def expand_ranged(word: str, offset: int, bounds: Bounds) -> list[Action]:
    """`0F{0..3}` -> 0F0 0F1 0F2 0F3; `{0..3}F0` ranges over stages; both ranges zip."""
    m = _PART_RE.match(word)
    if m is None:
        raise ScanError("PPS004", f"malformed ranged token `{_short(word)}`", offset, len(word),
                        help="put one `{a..b}` in place of the stage or the microbatch, e.g. `0F{0..3}`")
    kind = KIND_BY_NAME.get(m.group(2))
    if kind is None:
        raise _bad_kind(word, m.group(2), offset)
    _check_microbatch(word, kind, m.group(3) is not None, offset)
    stages = _range(m.group(1), word, offset, bounds[0], "stage")
    micros: range | int | None = None
    if m.group(3) is not None:
        micros = _range(m.group(3), word, offset, bounds[1], "microbatch")
    if isinstance(stages, range) and isinstance(micros, range):
        if len(stages) != len(micros):
            raise ScanError("PPS005", f"the two ranges in `{_short(word)}` differ in length "
                            f"({len(stages)} and {len(micros)})", offset, len(word))
        return [make_action(s, kind, mb) for s, mb in zip(stages, micros)]
    if isinstance(stages, range):
        return [make_action(s, kind, micros) for s in stages]  # type: ignore[arg-type]
    if isinstance(micros, range):
        return [make_action(stages, kind, mb) for mb in micros]
    return [make_action(stages, kind, micros)]


def steps_in(word: str, bounds: Bounds) -> int:
    """How many steps `expand_word` makes of `word`, without making them: the length of its
    range (ScanError where the range is malformed or out of bounds)."""
    m = _PART_RE.match(word) if "{" in word else None
    if m is None:
        return 1
    parts = [_range(m.group(1), word, 0, bounds[0], "stage")]
    if m.group(3) is not None:
        parts.append(_range(m.group(3), word, 0, bounds[1], "microbatch"))
    return max((len(r) for r in parts if isinstance(r, range)), default=1)


def expand_word(word: str, offset: int, bounds: Bounds) -> list[Action]:
    return expand_ranged(word, offset, bounds) if "{" in word else [parse_word(word, offset, bounds)]


def split_words(text: str) -> list[tuple[str, int]]:
    """Blank-separated words with their offsets."""
    return [(m.group(0), m.start()) for m in re.finditer(r"\S+", text)]


def zip_lengths(members: Sequence[tuple[str, int, Sequence[object]]]) -> None:
    """Raise PPS005 unless every zipped member expands to the same number of steps."""
    lengths = {len(items) for _, _, items in members}
    if len(lengths) > 1:
        listing = ", ".join(f"`{w}` has {len(items)}" for w, _, items in members)
        _, offset, _ = members[0]
        raise ScanError("PPS005", f"zipped members differ in length: {listing}", offset, 1,
                        help="every member of `[...]` must expand to the same number of actions")

