"""What the commands print about files: one line whatever the names hold.

File names may hold newlines and control characters (a tar member, an archive's own name), and
bytes that are not UTF-8 (held as surrogate escapes): printed as they are, a newline split an
error over two lines and an escape sequence reached the terminal; the bytes were shown as "?"
by one command and "\\udcff" by the other.
"""

from __future__ import annotations

import logging

#: Surrogate escapes of bytes that are not UTF-8 (``os.fsdecode``'s ``surrogateescape``).
_ESCAPED_BYTES = range(0xDC80, 0xDD00)


def printable(text: str) -> str:
    """``text`` with control characters written as escapes (``\\n``, ``\\x1b``) and bytes that
    are not UTF-8 as ``\\xNN``; printable text (any script) as it is."""
    if text.isprintable():
        return text
    out = []
    for char in text:
        code = ord(char)
        if code in _ESCAPED_BYTES:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif char.isprintable():
            out.append(char)
        else:
            out.append(repr(char)[1:-1])
    return "".join(out)


class PrintableFormatter(logging.Formatter):
    """A log record on one line (see ``printable``); a traceback (``-d``) keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        return printable(super().formatMessage(record))


def setup_stderr_logging(level: int, form: str) -> None:
    """``logging.basicConfig`` for stderr, each message on one line (like it, nothing when the
    root logger has handlers already: a program or test suite that calls ``main``)."""
    handler = logging.StreamHandler()
    handler.setFormatter(PrintableFormatter(form))
    logging.basicConfig(level=level, handlers=[handler])
