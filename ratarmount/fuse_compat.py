"""The FUSE binding, imported in one place.

We use mfusepy (the maintained fork of fusepy: same ``Operations`` API, libfuse 3 support,
thread-safe). This module adds READDIRPLUS: directory listings hand the kernel full attributes,
so ``find``/``ls -l``/``os.walk`` followed by stats are answered from the kernel's caches instead
of one getattr round trip per file.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import threading
from typing import Any, Optional, Set

logger = logging.getLogger(__name__)

# mfusepy loads libfuse 2 when both are installed; prefer libfuse 3 (READDIRPLUS, better caching
# control) unless the user picked a library explicitly.
if not os.environ.get("FUSE_LIBRARY_PATH") and not os.environ.get("FUSE_LIBRARY_NAME"):
    if ctypes.util.find_library("fuse3"):
        os.environ["FUSE_LIBRARY_NAME"] = "fuse3"

try:
    import mfusepy as fuse
except (ImportError, OSError) as exc:  # reported by the CLI; OSError: mfusepy found no libfuse
    fuse = None  # type: ignore[assignment]
    IMPORT_ERROR: Optional[BaseException] = exc
else:
    IMPORT_ERROR = None

#: A writable memoryview over C memory, made without a ctypes array type: ``c_char * size`` makes
#: (and ctypes caches for good) one type per distinct size.
_memory_view_of = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)(
    ("PyMemoryView_FromMemory", ctypes.pythonapi)
)
_PYBUF_WRITE = 0x200

FUSE_READDIR_PLUS = 1
FUSE_FILL_DIR_PLUS = 2
FUSE_UNKNOWN_INO = 0xFFFFFFFF  # libfuse's "no inode number": it picks one


def libfuse_version() -> str:
    if fuse is None:
        return "unavailable"
    return f"{getattr(fuse, 'fuse_version_major', '?')}.{getattr(fuse, 'fuse_version_minor', '?')}"


if fuse is not None:

    class FUSE(fuse.FUSE):  # type: ignore[misc,name-defined]
        """mfusepy's FUSE with attribute-carrying readdir (libfuse 3) and pinned thread states."""

        _pinned: Set[int] = set()

        def _wrapper(self, func: Any, *args: Any, **kwargs: Any) -> Any:
            # ctypes creates and destroys a Python thread state around every callback from a
            # libfuse worker thread: tens of microseconds per FUSE request, and thread-locals
            # vanish between requests. One extra PyGILState_Ensure per worker keeps its thread
            # state alive for the life of the thread.
            ident = threading.get_ident()
            if ident not in self._pinned:
                ctypes.pythonapi.PyGILState_Ensure()
                self._pinned.add(ident)
            return super()._wrapper(func, *args, **kwargs)

        def read(self, path: Optional[bytes], buf: Any, size: int, offset: int, fip: Any) -> int:
            """Read straight into libfuse's buffer (no bytes object, no extra copy)."""
            address = ctypes.cast(buf, ctypes.c_void_p).value
            view = _memory_view_of(address, size, _PYBUF_WRITE)
            fh = fip.contents.fh
            decoded = None if fh or path is None else path.decode(self.encoding, self.errors)
            return int(self.operations.read_into(view, offset, fh, decoded))

        def lseek(self, path: Optional[bytes], offset: int, whence: int, fip: Any) -> int:
            """``SEEK_DATA``/``SEEK_HOLE`` (mfusepy lists libfuse's ``lseek`` but has no method
            that calls the operations' one)."""
            if path is None:
                raise fuse.FuseOSError(errno.EBADF)
            return int(self.operations.lseek(path.decode(self.encoding, self.errors), offset, whence))

        def fgetattr(self, path: Optional[bytes], buf: Any, fip: Any) -> int:
            """getattr without the attribute dict: copy the packed ``struct stat`` into place."""
            packed = self.operations.stat_bytes(None if path is None else path.decode(self.encoding, self.errors))
            ctypes.memmove(buf, packed, len(packed))
            return 0

        def readdir_fuse_3(
            self, path: Optional[bytes], buf: Any, filler: Any, offset: int, fip: Any, flags: int
        ) -> int:
            """Serve a listing prepared by ``opendir`` with real offsets.

            With offsets, libfuse hands each entry's attributes straight to the kernel (the
            offset-less mode drops them), so a READDIRPLUS fills the kernel's dentry and
            attribute caches and the stats that follow a listing never reach us. A plain READDIR
            (the kernel alternates when nobody stats the entries) uses only type and inode.
            Entries carry their ``struct stat`` packed as bytes, passed to the filler as they are.
            """
            fill = ctypes.cast(filler, RAW_FILLER)
            plus = bool(flags & FUSE_READDIR_PLUS)
            listing = self.operations.listing(fip.contents.fh)
            for position in range(offset, len(listing)):
                name, packed, fill_flags = listing[position]
                if fill(buf, name, packed, position + 1, fill_flags if plus else 0):
                    break
            return 0

    #: libfuse 3's ``fuse_fill_dir_t`` taking the ``struct stat *`` as a byte string.
    RAW_FILLER = ctypes.CFUNCTYPE(
        ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int
    )

else:  # pragma: no cover
    FUSE = None  # type: ignore[assignment,misc]
