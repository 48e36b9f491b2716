"""`ppdsl lint --explain CODE`: what any diagnostic code means and how to fix it.

The explanation of each code is its section `#### PPSnnn: summary` of the reference page
docs/language.md (a test holds every code of `codes.CODES` to a section there), so what the
command prints is what the documentation says. The page ships in the wheel as
ppdsl/docs/language.md, as the grammar does.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from pathlib import Path

from .codes import CODES
from .wording import did_you_mean

PAGE_NAME = "language.md"
_SECTION_RE = re.compile(r"^#### (PPS\d{3}):[^\n]*\n(.*?)(?=^#{1,4} |\Z)", re.M | re.S)


def page_text() -> str:
    """The page shipped in the wheel (ppdsl/docs), else the source tree's docs/."""
    shipped = resources.files("ppdsl").joinpath("docs").joinpath(PAGE_NAME)
    if shipped.is_file():
        return shipped.read_text(encoding="utf-8")
    return (Path(__file__).resolve().parents[1] / "docs" / PAGE_NAME).read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def sections() -> dict[str, str]:
    """Code -> the body of its section in the page (markdown, as written)."""
    return {m.group(1): m.group(2).strip() for m in _SECTION_RE.finditer(page_text())}


def normal(code: str) -> str:
    """`pps003`, ` PPS003 ` -> `PPS003`."""
    return code.strip().upper()


def explain(code: str) -> str | None:
    """The explanation of `code` (any case), or None when ppdsl has no such code."""
    code = normal(code)
    if code not in CODES:
        return None
    body = sections().get(code, "")
    from .check import RULE_OF_CODE  # (the checker's registry names the family that reports it)

    rule = RULE_OF_CODE.get(code)
    where = (f"\n\nReported by `ppdsl lint` (the checker's `{rule.FAMILY}` family, "
             f"{rule.__name__.replace('.', '/')}.py); how the checks work: docs/checks.md." if rule is not None else "")
    return f"{code}: {CODES[code]}\n\n{body}{where}".rstrip()


def unknown_code(code: str) -> str:
    """The usage error for a code ppdsl does not have, with the closest one."""
    hint = did_you_mean(normal(code), CODES).strip()
    return (f"no diagnostic code `{code.strip()[:40]}`{'; ' + hint if hint else ''} (the codes, {min(CODES)}-{max(CODES)}, "
            "are listed in docs/language.md#error-codes)")
