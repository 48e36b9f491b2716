"""Every diagnostic code ppdsl can emit, with a one-line summary.

Families: PPS0xx the language (syntax, header, generators, input files), PPS1xx structure
and dependencies, PPS2xx communication and deadlock, PPS3xx memory and timing, PPS4xx
warnings about style and efficiency. `docs/language.md` explains each code with a fix;
a test keeps that page and this table in step.
"""

from __future__ import annotations

from typing import Final

CODES: Final[dict[str, str]] = {
    # --- input files
    "PPS000": "the file cannot be read as text (unreadable path, binary data, bad encoding)",
    # --- syntax
    "PPS001": "unexpected character",
    "PPS002": "unexpected token or end of input",
    "PPS003": "malformed action token",
    "PPS004": "bad range",
    "PPS005": "zipped ranges of different lengths",
    "PPS006": "unbalanced bracket",
    "PPS007": "malformed overlapped pair",
    "PPS008": "malformed communication batch",
    # --- header and rows
    "PPS010": "missing pipeline header",
    "PPS011": "header given twice, or contradicted by the rows",
    "PPS012": "unknown header option or bad value",
    "PPS013": "rank row out of range or given twice",
    "PPS014": "stage or microbatch out of range",
    "PPS015": "size limit exceeded",
    "PPS016": "placement cannot be determined",
    "PPS017": "rows and a generator in one file",
    # --- generators
    "PPS020": "unknown generator",
    "PPS021": "unknown generator argument",
    "PPS022": "bad generator argument or unsupported configuration",
    # --- conversion
    "PPS030": "malformed PyTorch CSV",
    "PPS031": "construct the target format cannot express",
    # --- cost model (simulator)
    "PPS350": "unknown cost key, or a per-stage cost for a stage the program lacks",
    "PPS351": "bad cost value",
    "PPS352": "malformed cost profile file",
    "PPS353": "the simulation cannot reach the end: a rank waits forever under the chosen communication model",
}
