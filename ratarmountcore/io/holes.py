"""``SEEK_DATA`` and ``SEEK_HOLE`` over a file's data extents.

A sparse member of an archive stores only its data extents; the rest reads as zeros. Tools that
copy or archive files ask the file system where its data is (``lseek`` with ``SEEK_DATA`` and
``SEEK_HOLE``: ``cp``, ``tar --sparse``, ``rsync --sparse``) and then write holes instead of zeros,
so a disk image taken out of a mount stays as small as it was put in. The answers follow
lseek(2): the end of the file counts as a hole, and an offset at or beyond it is ``ENXIO``.
"""

from __future__ import annotations

import errno
import os
from typing import Optional, Sequence, Tuple

#: (offset, length) of the parts of a file that hold data, in order.
Extents = Sequence[Tuple[int, int]]


def seek_data(size: int, extents: Optional[Extents], offset: int, whence: int) -> int:
    """Where ``lseek(fd, offset, whence)`` goes for ``whence`` ``SEEK_DATA`` or ``SEEK_HOLE`` in a
    file of ``size`` bytes whose data is ``extents`` (None: all of it). ``OSError`` ENXIO when
    ``offset`` is not before the end or, for ``SEEK_DATA``, no data follows it."""
    if whence not in (os.SEEK_DATA, os.SEEK_HOLE):
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
    if offset < 0 or offset >= size:
        raise OSError(errno.ENXIO, os.strerror(errno.ENXIO))
    if extents is None:
        return offset if whence == os.SEEK_DATA else size
    end = 0  # (the end of the run of adjoining extents that holds ``offset``, if any)
    for start, length in extents:
        stop = min(start + length, size)
        if stop <= offset or stop <= start:  # (before ``offset``, empty, or past the end)
            continue
        if start > offset and start > end:  # a hole before this extent holds ``offset``
            if end > offset:
                break  # (``offset`` is in the data run that ended at ``end``)
            return start if whence == os.SEEK_DATA else offset
        end = max(end, stop)
    if end > offset:
        return offset if whence == os.SEEK_DATA else end
    if whence == os.SEEK_DATA:
        raise OSError(errno.ENXIO, os.strerror(errno.ENXIO))
    return offset
