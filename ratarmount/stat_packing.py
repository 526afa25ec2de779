"""``struct stat`` as bytes, packed in one C call.

Filling mfusepy's ``c_stat`` field by field costs about 15 ctypes attribute writes (3-4 µs) per
entry, which dominated listings with READDIRPLUS (every entry carries its attributes) and each
LOOKUP. Here the layout is read once from ``c_stat`` itself (offsets and sizes of the fields we
set, whatever the platform), turned into one ``struct.Struct``, and each entry becomes a single
``pack`` call. The bytes are handed to libfuse as they are (``memmove`` into its buffer, or as
the ``struct stat *`` argument of the directory filler).
"""

from __future__ import annotations

import ctypes
import operator
import struct
from typing import Any, Callable, List, Tuple

from ratarmountcore.sources.base import FileInfo

#: The fields we set, in the order ``_values`` produces them. Everything else stays zero.
_FIELDS = (
    "st_ino",
    "st_nlink",
    "st_mode",
    "st_uid",
    "st_gid",
    "st_rdev",
    "st_size",
    "st_blksize",
    "st_blocks",
    "st_atimespec.tv_sec",
    "st_atimespec.tv_nsec",
    "st_mtimespec.tv_sec",
    "st_mtimespec.tv_nsec",
    "st_ctimespec.tv_sec",
    "st_ctimespec.tv_nsec",
)

_STANDARD_CODES = {
    (1, True): "b",
    (1, False): "B",
    (2, True): "h",
    (2, False): "H",
    (4, True): "i",
    (4, False): "I",
    (8, True): "q",
    (8, False): "Q",
}


def _field(structure: Any, dotted: str) -> Tuple[int, Any]:
    """(offset, ctypes type) of a possibly nested field such as ``st_mtimespec.tv_sec``."""
    offset = 0
    for part in dotted.split("."):
        descriptor = getattr(structure, part)
        offset += descriptor.offset
        structure = dict(structure._fields_)[part]
    return offset, structure


def _code(ctype: Any) -> str:
    signed = ctype._type_.islower() if isinstance(getattr(ctype, "_type_", None), str) else False
    return _STANDARD_CODES[(ctypes.sizeof(ctype), signed)]


class StatPacker:
    """Packs ``FileInfo`` into the bytes of the platform's ``struct stat`` (as mfusepy lays it out)."""

    def __init__(self, c_stat: Any) -> None:
        layout: List[Tuple[int, str, int]] = []
        for index, name in enumerate(_FIELDS):
            offset, ctype = _field(c_stat, name)
            layout.append((offset, _code(ctype), index))
        layout.sort()
        fmt = "="
        position = 0
        for offset, code, _ in layout:
            if offset < position:
                raise ValueError(f"overlapping stat fields at offset {offset}")
            fmt += f"{offset - position}x{code}" if offset > position else code
            position = offset + struct.calcsize("=" + code)
        size = ctypes.sizeof(c_stat)
        fmt += f"{size - position}x"
        self.size = size
        self._struct = struct.Struct(fmt)
        self._order: Callable[[Tuple[int, ...]], Tuple[int, ...]] = operator.itemgetter(*(i for _, _, i in layout))

    def pack(self, info: FileInfo) -> bytes:
        seconds, nanoseconds = divmod(info.mtime_ns, 1_000_000_000)
        size = info.size
        return self._struct.pack(
            *self._order(
                (
                    info.ino,
                    info.nlink,
                    info.mode,
                    info.uid,
                    info.gid,
                    info.rdev,
                    size,
                    4096,
                    info.st_blocks,
                    seconds,
                    nanoseconds,
                    seconds,
                    nanoseconds,
                    seconds,
                    nanoseconds,
                )
            )
        )
