"""A cheap look at the members at the start of a tar stream (before it is indexed).

Used to choose build parameters that depend on the kind of archive -- many small members or a few
large ones -- from the first decompressed bytes alone. A guess: the scan that follows never
relies on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

from ..errors import CorruptHeaderError
from .scanner import parse_number

if TYPE_CHECKING:
    from ..compression.base import CompressedReader

BLOCK = 512
#: Decompressed bytes looked at.
SAMPLE_BYTES = 1024 * 1024
#: Type flags of members that hold file data (regular files, contiguous files, old-style files).
_DATA_TYPES = {b"0", b"\0", b"7"}


def typical_member_size(head: bytes, most: int = 200) -> Optional[int]:
    """The median size of the file members whose headers lie in ``head`` (the first bytes of a
    tar stream), at most ``most`` of them; None when there are none or ``head`` is not tar."""
    sizes: List[int] = []
    position = 0
    while position + BLOCK <= len(head) and len(sizes) < most:
        header = head[position : position + BLOCK]
        if header[257:262] != b"ustar" and sum(header[148:156]) == 0:
            break  # end of archive (zero blocks) or not a tar header
        try:
            size = parse_number(header[124:136], "size", position)
        except CorruptHeaderError:
            break
        if header[156:157] in _DATA_TYPES and size >= 0:
            sizes.append(size)
        position += BLOCK + (size + BLOCK - 1) // BLOCK * BLOCK
    return _median(sizes) if sizes else None


def _median(values: List[int]) -> int:
    """The median, rounded down (``statistics`` would bring decimal and fractions into the mount
    daemon, ~0.5 MiB, for this one call)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) // 2


def tell_member_size(reader: "CompressedReader") -> None:
    """Before a first pass: give a backend that asks for it the typical size of the members in
    the first decompressed bytes. Not for a stream of less than ``SAMPLE_BYTES`` compressed: the
    sample would decode most of it once more before the first pass does (100 class .tar.gz of
    0.5 MB: 3.8 of the ~20 ms each took to index), and what it decides -- fewer, larger chunks
    for the first pass of large members -- saves a few milliseconds only on larger streams."""
    if reader.wants_member_size and reader.compressed_size >= SAMPLE_BYTES:
        typical = typical_member_size(reader.head(SAMPLE_BYTES))
        if typical is not None:
            reader.suggest_member_size(typical)
