"""A folder's entries packed as directory records, written into the index when it is built.

Listing a folder from its rows costs a query and a record per entry, ~0.1 ms for a folder of 100
files: most of the time of a ``find`` over a mount, where the kernel asks for 1,000 folders one
after the other. The index keeps each folder's listing ready instead: its entries as directory
records in the layout Linux and FUSE use (``struct fuse_dirent``: inode number, position in the
listing, name length, type, the name zero-padded to 8 bytes), compressed, with the end of each
record. A listing is then one row read and one decompression; the front-end hands the records
on as they are (or with the reserved bytes a listing with attributes puts ahead of each).

Only folders whose entries are all files, links or other non-folders are packed, of up to
``MAX_ENTRIES`` entries: a subfolder is listed with its attributes (a ``find`` descends into it),
which are not kept here, and a large folder is listed a part at a time anyway. Positions count
from 3: a listing starts with "." and "..".
"""

from __future__ import annotations

import array
import itertools
import operator
import stat
import struct
import zlib
from typing import Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Tuple

#: Largest folder packed (larger ones are listed a part at a time from their rows).
MAX_ENTRIES = 4096
#: Position of the first entry in a listing ("." is 1, ".." is 2).
FIRST_POSITION = 3
#: Inode numbers a listing can show (1 is the root; the front-end names larger ones otherwise).
INO_LIMIT = 1 << 56
_HEAD = struct.Struct("=QQII")
_BY_LENGTH: Dict[int, struct.Struct] = {}


class DirentBlock(NamedTuple):
    """A folder's packed listing: ``records`` and the end offset of each record in it."""

    ends: Sequence[int]
    records: bytes


def _new_packer(length: int) -> struct.Struct:
    """The packer of records whose name is ``length`` bytes long (made once per length)."""
    packer = _BY_LENGTH[length] = struct.Struct(_HEAD.format + f"{(length + 7) & ~7}s")
    return packer


def record(ino: int, position: int, name: bytes, mode: int) -> bytes:
    """One directory record, padded to 8 bytes (``pack_folder`` makes them inline)."""
    length = len(name)
    packer = _BY_LENGTH.get(length) or _new_packer(length)
    return packer.pack(ino, position, length, stat.S_IFMT(mode) >> 12, name)


def pack_folder(rows: Sequence[Tuple[bytes, int, int]]) -> Optional[bytes]:
    """The stored form of a folder whose entries are ``rows`` (name, mode, inode number as shown,
    in listing order), or None when it is not packed."""
    if not rows or len(rows) > MAX_ENTRIES:
        return None
    records: List[bytes] = []
    add = records.append
    packers = _BY_LENGTH
    position = FIRST_POSITION
    for name, mode, ino in rows:  # (every index build packs every folder: kept lean)
        kind = mode >> 12 & 15
        if kind == 4 or not 1 < ino < INO_LIMIT:  # a folder, or no inode number of its own
            return None
        length = len(name)
        packer = packers.get(length) or _new_packer(length)
        add(packer.pack(ino, position, length, kind, name))
        position += 1
    ends = array.array("I", itertools.accumulate(map(len, records)))
    return zlib.compress(ends.tobytes() + b"".join(records), 1)


def unpack(entries: int, stored: bytes) -> DirentBlock:
    """The listing ``pack_folder`` stored for a folder of ``entries`` entries."""
    raw = zlib.decompress(stored)
    head = 4 * entries
    ends = memoryview(raw)[:head].cast("I")
    return DirentBlock(ends, raw[head:])


def pack_all(rows: Iterable[Tuple[bytes, bytes, int, int]]) -> Iterator[Tuple[bytes, int, bytes]]:
    """(parent, entries, stored form) of every packed folder among ``rows`` (parent, name, mode,
    inode number as shown), which come sorted by parent, then in listing order."""
    for parent, group in itertools.groupby(rows, key=operator.itemgetter(0)):
        folder = [row[1:] for row in itertools.islice(group, MAX_ENTRIES + 1)]
        stored = pack_folder(folder)
        if stored is not None:
            yield parent, len(folder), stored
