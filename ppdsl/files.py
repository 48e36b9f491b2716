"""Reading a file's bytes or text: I/O problems are usage errors (exit 2), binary data PPS000.

A leaf (it imports only `diagnostics` and `limits`): the loader, the costs reader and the CLI
all read files, and none of them needs the others to do it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .diagnostics import Diagnostic, PpsError, UsageError
from .limits import MAX_FILE_BYTES

# Standard input can be read once; what was read is kept, with the stream it came from, so
# that a second reader (the excerpt under a diagnostic, a second `-`) sees the same text.
_STDIN: list[tuple[object, bytes]] = []


def read_bytes(path: str) -> bytes:
    """A file's bytes (or standard input's for `-`), at most MAX_FILE_BYTES. I/O problems raise
    UsageError (exit 2)."""
    too_big = UsageError(f"{path}: larger than {MAX_FILE_BYTES // 2**20} MiB")
    if path == "-":
        import sys

        if not _STDIN or _STDIN[0][0] is not sys.stdin:
            _STDIN[:] = [(sys.stdin, sys.stdin.buffer.read(MAX_FILE_BYTES + 1))]
        data = _STDIN[0][1]
        if len(data) > MAX_FILE_BYTES:
            raise too_big
        return data
    p = Path(path)
    try:
        if p.is_dir():
            raise UsageError(f"{path}: is a directory")
        # Read at most one byte past the limit: /dev/zero or a pipe has no size to check first.
        # A regular file is read by its size: a read of n bytes sets n aside first, and every
        # page of a fresh buffer that is written costs a page fault.
        with p.open("rb") as f:
            st = os.fstat(f.fileno())
            size = st.st_size if stat.S_ISREG(st.st_mode) else MAX_FILE_BYTES
            data = f.read(min(size, MAX_FILE_BYTES) + 1)
            if len(data) > size:  # it grew since: the rest, up to the limit
                data += f.read(MAX_FILE_BYTES + 1 - len(data))
        if len(data) > MAX_FILE_BYTES:
            raise too_big
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except PermissionError:
        raise UsageError(f"{path}: permission denied") from None
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from None
    return data


def _looks_utf16(data: bytes) -> bool:
    """A UTF-16 byte-order mark, or ASCII text with every other byte NUL (UTF-16 without one)."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return True
    head = data[:200]
    return len(head) >= 4 and (head[1::2].count(0) >= len(head) // 2 - 1 or head[0::2].count(0) >= len(head) // 2 - 1)


def _single_byte_text(data: bytes) -> bool:
    """Text in an 8-bit encoding (Latin-1, Windows-1252): no control byte but tab and line ends
    in its first 4 KiB, where binary data has many."""
    head = data[:4096]
    return not head.translate(None, b"\t\n\r").translate(None, bytes(range(32, 256)))


def read_text(path: str) -> str:
    """A file's text. I/O problems raise UsageError (exit 2); binary data raises PPS000 (exit 1)."""
    data = read_bytes(path)
    nul = data.find(b"\0")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        nul = exc.start if nul < 0 else min(nul, exc.start)
    if nul >= 0:
        line = data.count(b"\n", 0, nul) + 1
        column = nul - (data.rfind(b"\n", 0, nul) + 1) + 1
        if _looks_utf16(data):
            raise PpsError([Diagnostic("PPS000", "UTF-16 text, not UTF-8", path, line, column,
                                       help="save the file as UTF-8 (PowerShell's `>` writes UTF-16; "
                                            "`iconv -f UTF-16 -t UTF-8` converts it)")])
        if data[nul] != 0 and _single_byte_text(data):
            raise PpsError([Diagnostic("PPS000", f"byte 0x{data[nul]:02x} is not UTF-8: the file is text in another "
                                       "encoding", path, line, column,
                                       help="save the file as UTF-8 (`iconv -f latin1 -t utf-8 FILE` converts Latin-1)")])
        raise PpsError([Diagnostic("PPS000", "binary data, not a UTF-8 text file", path, line, column,
                                   help=".pps and .csv schedules are plain UTF-8 text")])
    return text.removeprefix("\ufeff")
