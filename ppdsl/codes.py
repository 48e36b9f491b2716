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
    # --- checker: structure and dependencies (ppdsl/check/)
    "PPS101": "a stage runs on more than one rank, or not on the rank its placement names",
    "PPS102": "program shape inconsistent: rows, placement, stage or microbatch out of range",
    "PPS103": "a forward or backward is missing",
    "PPS104": "an action appears more than once",
    "PPS105": "a backward is both full (B) and split (I/W), or split without its other half",
    "PPS106": "backward work in a forward-only (mode=inference) program",
    "PPS107": "a backward runs before its forward, or W before its I, on the same rank",
    "PPS108": "the actions wait on each other in a cycle (compute-only program)",
    "PPS109": "a recompute (R) runs after the backward that needs it, or no backward needs it",
    "PPS110": "an OFFLOAD without its RELOAD, or a RELOAD without its OFFLOAD",
    "PPS111": "activations read while offloaded (between OFFLOAD and RELOAD), or moved before they are made",
    "PPS112": "a sharded stage computes outside its UNSHARD..RESHARD, or a RESHARD frees what nothing gathered",
    "PPS113": "a REDUCE_GRAD before its stage's last backward (B, or W) of the step",
    # --- checker: communication and deadlock
    "PPS201": "a send has no matching receive",
    "PPS202": "a receive has no matching send",
    "PPS203": "a send or receive appears more than once",
    "PPS204": "a send or receive between two stages on the same rank",
    "PPS205": "a send runs before the compute that produces its data",
    "PPS206": "a compute runs before the receive that feeds it, or nothing carries its input",
    "PPS207": "a send or receive to a stage that does not exist",
    "PPS208": "a batch holds something other than sends and receives",
    "PPS210": "deadlock: ranks wait for each other in a cycle under the communication model",
    "PPS211": "a rank waits forever for an operation no rank reaches",
    "PPS212": "messages out of order on a link: the k-th send is not the one the k-th receive expects",
    "PPS220": "lowering needs a compute-only program that runs to the end",
    # --- checker: memory
    "PPS301": "peak live activations exceed the memory limit",
    "PPS302": "memory weights do not match the number of stages",
    # --- checker: warnings
    "PPS401": "microbatches of a stage run out of order",
    "PPS402": "a rank has no work",
    "PPS403": "idle steps at the end of a row",
    # --- cost model (simulator)
    "PPS350": "unknown cost key, or a per-stage cost for a stage the program lacks",
    "PPS351": "bad cost value",
    "PPS352": "malformed cost profile file",
    "PPS353": "the simulation cannot reach the end: a rank waits forever under the chosen communication model",
}
