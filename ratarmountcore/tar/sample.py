"""A cheap look at the members at the start of a tar stream (before it is indexed).

Used to choose build parameters that depend on the kind of archive -- many small members or a few
large ones -- from the first decompressed bytes alone. A guess: the scan that follows never
relies on it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

from ..errors import CorruptHeaderError
from ..formats import COMPRESSIONS, sniff_bytes, tar_header_checksum_ok
from .scanner import parse_number

if TYPE_CHECKING:
    from ..compression.base import CompressedReader

BLOCK = 512
#: Decompressed bytes looked at.
SAMPLE_BYTES = 1024 * 1024
#: Type flags of members that hold file data (regular files, contiguous files, old-style files).
_DATA_TYPES = {b"0", b"\0", b"7"}


def typical_member_size(head: bytes, most: int = 200, descend: bool = False) -> Optional[int]:
    """The median size of the file members whose headers lie in ``head`` (the first bytes of a
    tar stream), at most ``most`` of them; None when there are none or ``head`` is not tar.

    descend / count the members of the uncompressed tars inside instead of those tars, as a
        recursive mount shows and reads them (ImageNet's train tar: class tars of 140 MB, the
        JPEGs in them 110 KB), and a compressed member as one of size 0 (see below)."""
    sizes: List[int] = []
    #: Where the data of each inner tar being looked into ends, innermost last.
    ends: List[int] = []
    position = 0
    while position + BLOCK <= len(head) and len(sizes) < most:
        header = head[position : position + BLOCK]
        if header[257:262] != b"ustar" and sum(header[148:156]) == 0:
            if not ends:
                break  # end of archive (zero blocks) or not a tar header
            position = ends.pop()  # the end of an inner tar: on with the outer one
            continue
        try:
            size = parse_number(header[124:136], "size", position)
        except CorruptHeaderError:
            break
        end = position + BLOCK + (size + BLOCK - 1) // BLOCK * BLOCK
        if header[156:157] in _DATA_TYPES and size >= 0:
            first = head[position + BLOCK : position + 2 * BLOCK]
            if descend and size >= 2 * BLOCK and tar_header_checksum_ok(first):
                ends.append(end)
                position += BLOCK
                continue
            if descend and sniff_bytes(first) in COMPRESSIONS:
                # A compressed archive, read through a decoder of its own: in pieces of its
                # compressed bytes, a seek point's worth or less (a .tar.gz of 100 class .tar.gz
                # of 0.5 MB: seek points 2 MiB apart decoded 1.35 MB of the outer stream per
                # random read of a JPEG).
                sizes.append(0)
                position = end
                continue
            sizes.append(size)
        position = end
    return _median(sizes) if sizes else None


def _median(values: List[int]) -> int:
    """The median, rounded down (``statistics`` would bring decimal and fractions into the mount
    daemon, ~0.5 MiB, for this one call)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) // 2


def tell_member_size(reader: "CompressedReader", recursive: bool = False) -> None:
    """Before a first pass: give a backend that asks for it the typical size of the members in
    the first decompressed bytes. Not for a stream of less than ``SAMPLE_BYTES`` compressed: the
    sample would decode most of it once more before the first pass does (100 class .tar.gz of
    0.5 MB: 3.8 of the ~20 ms each took to index), and what it decides -- fewer, larger chunks
    for the first pass of large members -- saves a few milliseconds only on larger streams.
    ``recursive``: the members of the inner tars count, not those tars."""
    if reader.wants_member_size and reader.compressed_size >= SAMPLE_BYTES:
        typical = typical_member_size(reader.head(SAMPLE_BYTES), descend=recursive)
        if typical is not None:
            reader.suggest_member_size(typical)
