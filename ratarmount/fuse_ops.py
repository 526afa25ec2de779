"""FUSE operations: a thin translation of ``MountSource`` into errno.

Threading model: libfuse runs its multi-threaded loop; every callback may run concurrently.
``MountSource`` implementations are thread-safe (one SQLite connection per thread, ``pread`` on
shared descriptors), so no lock is held around lookups or reads. The only shared mutable state
here is the open-handle table, a dict whose single-key operations are atomic under the GIL.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import itertools
import logging
import os
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, TypeVar, Union

from ratarmountcore.sources.base import FileInfo, MountSource

from .capabilities import FUSE_CAP_NO_OPEN_SUPPORT, wanted_capabilities
from .errnos import errno_of
from .fuse_compat import FUSE_FILL_DIR_PLUS, FUSE_UNKNOWN_INO, fuse
from .open_files import OpenFiles
from .stat_packing import StatPacker

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])
Listed = Tuple[bytes, bytes, int]
ENCODING = "utf-8"  # of names handed to libfuse, as mfusepy decodes paths (with surrogateescape)


def translate_errors(method: F) -> F:
    """Turn exceptions into FuseOSError; unexpected ones are logged and become EIO."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except fuse.FuseOSError:
            raise
        except Exception as exc:
            code = errno_of(exc)
            if code == errno.EIO and not getattr(exc, "logged", False):  # (some are logged once, where found)
                logger.error(
                    "%s%s failed: %s", method.__name__, args[1:2], exc, exc_info=logger.isEnabledFor(logging.DEBUG)
                )
            raise fuse.FuseOSError(code) from None

    return wrapper  # type: ignore[return-value]


def path_ino(path: str) -> int:
    """An inode number for an entry whose source gives it none (``ino`` 0: entries of a folder
    source, folder versions): stable, from the path, in [2**62, 2**63) where no source numbers
    anything. Without one, a listing would carry d_ino 0, which readdir(3) skips: the entry
    would be missing from ``ls`` (the low-level front-end uses its node ids instead)."""
    digest = hashlib.blake2b(os.fsencode(path), digest_size=8).digest()
    return (int.from_bytes(digest, "little") & ((1 << 62) - 1)) | (1 << 62)


def info_to_attrs(info: FileInfo) -> Dict[str, int]:
    return {
        "st_mode": info.mode,
        "st_ino": info.ino,
        "st_nlink": info.nlink,
        "st_uid": info.uid,
        "st_gid": info.gid,
        "st_size": info.size,
        "st_mtime": info.mtime_ns,
        "st_atime": info.mtime_ns,
        "st_ctime": info.mtime_ns,
        "st_rdev": info.rdev,
        "st_blksize": 4096,
        "st_blocks": info.st_blocks,
    }


class FuseOperations(fuse.Operations if fuse is not None else object):  # type: ignore[misc]
    use_ns = True  # times are integers in nanoseconds

    def __init__(self, source: MountSource, on_ready: Optional[Callable[[], None]] = None) -> None:
        self.source = source
        self._on_ready = on_ready
        self.files = OpenFiles(source)
        #: Open directory listings: (name, packed struct stat, filler flags) per entry.
        self._listings: Dict[int, List[Listed]] = {}
        self._next_handle = itertools.count(1)
        self._packer = StatPacker(fuse.c_stat)
        self._no_open = False
        # libfuse asks for the same path several times in a row (LOOKUP, then OPEN); an immutable
        # tree lets us remember answers, misses included. Paths from libfuse are already
        # absolute and normalized.
        self._entry: Callable[[str], Optional[Tuple[FileInfo, bytes]]] = (
            functools.lru_cache(maxsize=8192)(self._lookup_entry) if source.is_immutable else self._lookup_entry
        )

    def _lookup_entry(self, path: str) -> Optional[Tuple[FileInfo, bytes]]:
        info = self.source.lookup(path)
        if info is None:
            return None
        if not info.ino:
            info = info._replace(ino=path_ino(path))
        return info, self._packer.pack(info)

    def _info(self, path: str) -> FileInfo:
        entry = self._entry(path)
        if entry is None:
            raise fuse.FuseOSError(errno.ENOENT)
        return entry[0]

    def init_with_config(self, conn: Any, config: Any) -> None:
        # Zero-message opens: when the kernel supports them, an ENOSYS answer to the first OPEN
        # makes it skip OPEN and RELEASE for every later open (keeping the page cache), and
        # reads come with the path. That is two round trips fewer per file read.
        capable = getattr(conn, "capable", 0) if conn is not None else 0
        libfuse3 = getattr(fuse, "fuse_version_major", 2) == 3
        # (not for a folder source: its files may change, the kernel would keep their old pages)
        self._no_open = libfuse3 and self.source.is_immutable and bool(capable & FUSE_CAP_NO_OPEN_SUPPORT)
        if libfuse3 and conn is not None:
            conn.want = wanted_capabilities(conn.want, capable, self.source.is_immutable)
        if self._on_ready is not None:
            self._on_ready()

    def destroy(self, path: str) -> None:
        self.files.clear()

    @translate_errors
    def getattr(self, path: str, fh: Optional[int] = None) -> Dict[str, int]:
        return info_to_attrs(self._info(path))

    @translate_errors
    def stat_bytes(self, path: str) -> bytes:
        """The packed ``struct stat`` of ``path`` (see ``stat_packing``)."""
        entry = self._entry(path)
        if entry is None:
            raise fuse.FuseOSError(errno.ENOENT)
        return entry[1]

    @translate_errors
    def opendir(self, path: str) -> int:
        entries = self.source.list_entries(path)
        if entries is None:
            self._info(path)
            raise fuse.FuseOSError(errno.ENOTDIR)
        pack = self._packer.pack
        listing: List[Listed] = [(b".", self.stat_bytes(path), FUSE_FILL_DIR_PLUS), (b"..", self._dotdot, 0)]
        plus = FUSE_FILL_DIR_PLUS
        prefix = path.rstrip("/") + "/"
        listing.extend(
            [
                (
                    name.encode(ENCODING, "surrogateescape"),
                    pack(info if info.ino else info._replace(ino=path_ino(prefix + name))),
                    plus,
                )
                for name, info in entries
            ]
        )
        handle = next(self._next_handle)
        self._listings[handle] = listing
        return handle

    @functools.cached_property
    def _dotdot(self) -> bytes:
        # The parent's attributes are not needed: libfuse looks ".." up itself. Type and "no inode".
        return self._packer.pack(FileInfo(mode=0o40755, size=0, mtime_ns=0, uid=0, gid=0, ino=FUSE_UNKNOWN_INO))

    def listing(self, fh: int) -> List[Listed]:
        return self._listings.get(fh, [])

    @translate_errors
    def readdir(self, path: str, fh: int) -> Iterable[Union[str, Tuple[str, Dict[str, int], int]]]:
        """Used by libfuse 2 only (libfuse 3 goes through ``fuse_compat.FUSE.readdir_fuse_3``):
        the listing ``opendir`` prepared, with the type and inode, all libfuse 2 passes on."""
        entries: List[Tuple[str, Dict[str, int], int]] = []
        for name, packed, _flags in self.listing(fh):
            st = fuse.c_stat.from_buffer_copy(packed)
            entries.append((name.decode(ENCODING, "surrogateescape"), {"st_mode": st.st_mode, "st_ino": st.st_ino}, 0))
        return entries

    def releasedir(self, path: str, fh: int) -> int:
        self._listings.pop(fh, None)
        return 0

    @translate_errors
    def readlink(self, path: str) -> str:
        info = self._info(path)
        if not info.is_symlink:
            raise fuse.FuseOSError(errno.EINVAL)
        return info.linkname

    @translate_errors
    def open(self, path: str, flags: int) -> int:
        if flags & os.O_ACCMODE != os.O_RDONLY:
            raise fuse.FuseOSError(errno.EROFS)
        info = self._info(path)
        if info.is_dir:
            raise fuse.FuseOSError(errno.EISDIR)
        if self._no_open:
            raise fuse.FuseOSError(errno.ENOSYS)  # see init_with_config; the open itself succeeds
        return self.files.open(info)

    @translate_errors
    def read_into(self, view: memoryview, offset: int, fh: int, path: Optional[str] = None) -> int:
        if fh == 0 and path is not None:  # an open the kernel did not tell us about
            return self.files.read_unopened(self._info(path), offset, view)
        return self.files.read(fh, offset, view)

    @translate_errors
    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        """mfusepy's bytes-returning read (``fuse_compat.FUSE`` reads into libfuse's buffer)."""
        view = memoryview(bytearray(size))
        return bytes(view[: self.read_into(view, offset, fh, path)])

    def release(self, path: str, fh: int) -> int:
        self.files.release(fh)
        return 0

    @translate_errors
    def lseek(self, path: str, offset: int, whence: int) -> int:
        """Where ``SEEK_DATA`` or ``SEEK_HOLE`` from ``offset`` goes in a file (the only
        ``lseek``s the kernel asks about): a sparse member's holes are its own. (Without it the
        kernel takes every file for data to its end: ``cp`` copied sparse members whole.)"""
        info = self._info(path)
        if not info.is_file:
            raise fuse.FuseOSError(errno.EINVAL)
        return self.source.seek_data(info, offset, whence)

    @translate_errors
    def statfs(self, path: str) -> Dict[str, int]:
        return self.source.statfs()
