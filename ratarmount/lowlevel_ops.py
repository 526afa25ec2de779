"""FUSE requests by node id: a thin translation of ``MountSource`` into reply payloads.

This is the request logic of the low-level front-end (``lowlevel.py`` holds the ctypes glue):
every method takes what the kernel sent and returns the bytes to reply, or raises; exceptions
become errno values in the glue (``fuse_ops.errno_of``). Nothing here touches libfuse, so the
logic is testable without a mount.

Threading model: libfuse's multi-threaded loop calls these methods from its worker threads at
once. ``MountSource`` implementations are thread-safe; the node table and the handle tables are
the only shared state here (a lock around the node table's counts, single-key dict operations
for handles).
"""

from __future__ import annotations

import errno
import functools
import itertools
import logging
import os
from typing import Callable, Dict, List, Optional, Tuple

from ratarmountcore.io.readers import MemberFile
from ratarmountcore.sources.base import FileInfo, MountSource

from . import kernel_abi as abi
from .inodes import ROOT_ID, InodeTable

logger = logging.getLogger(__name__)

#: Attributes, names and misses never change on an immutable tree: let the kernel keep them a day.
TIMEOUT = 86400
ENCODING = "utf-8"
#: Inode number in listings of entries that have none (readdir must not report 0).
UNKNOWN_INO = 0xFFFFFFFF

Entry = Tuple[FileInfo, bytes]  # info, packed struct fuse_attr
Listed = Tuple[bytes, str, FileInfo, bytes]  # name, path, info, packed attr


def _errno(code: int) -> OSError:
    return OSError(code, os.strerror(code))


class LowLevelOperations:
    def __init__(self, source: MountSource, on_ready: Optional[Callable[[], None]] = None) -> None:
        self.source = source
        self._on_ready = on_ready
        self.nodes = InodeTable()
        self._handles: Dict[int, MemberFile] = {}
        self._listings: Dict[int, List[Listed]] = {}
        self._next_handle = itertools.count(1)
        self.no_open = False
        self._timeout = TIMEOUT if source.is_immutable else 1
        # LOOKUP, then GETATTR or READ of the same path: remember recent answers (misses too).
        self._entry: Callable[[str], Optional[Entry]] = (
            functools.lru_cache(maxsize=8192)(self._lookup_entry) if source.is_immutable else self._lookup_entry
        )

    def _lookup_entry(self, path: str) -> Optional[Entry]:
        info = self.source.lookup(path)
        return None if info is None else (info, abi.pack_attr(info))

    def _require(self, path: str) -> Entry:
        entry = self._entry(path)
        if entry is None:
            raise _errno(errno.ENOENT)
        return entry

    # --- session ------------------------------------------------------------------------------
    def init(self, no_open_supported: bool) -> None:
        # Zero-message opens: an ENOSYS answer to the first OPEN makes the kernel skip OPEN and
        # RELEASE for every later open (keeping the page cache); reads then carry no handle.
        self.no_open = no_open_supported
        if self._on_ready is not None:
            self._on_ready()

    def destroy(self) -> None:
        self._handles.clear()
        self._listings.clear()

    # --- names --------------------------------------------------------------------------------
    def lookup(self, parent: int, name: bytes) -> bytes:
        path = self.nodes.child(parent, name.decode(ENCODING, "surrogateescape"))
        entry = self._entry(path)
        if entry is None:
            return abi.entry_out(0, abi.NEGATIVE_ATTR, self._timeout)
        node = self.nodes.remember(path)
        return abi.entry_out(node, self._attr(node, entry), self._timeout)

    def forget(self, node: int, count: int) -> None:
        self.nodes.forget(node, count)

    @staticmethod
    def _attr(node: int, entry: Entry) -> bytes:
        # Entries without an inode number of their own (e.g. PATH.versions) show their node id.
        return entry[1] if entry[0].ino else abi.pack_attr(entry[0]._replace(ino=node))

    def getattr(self, node: int) -> bytes:
        return abi.attr_out(self._attr(node, self._require(self.nodes.path(node))), self._timeout)

    def readlink(self, node: int) -> bytes:
        info = self._require(self.nodes.path(node))[0]
        if not info.is_symlink:
            raise _errno(errno.EINVAL)
        return info.linkname.encode(ENCODING, "surrogateescape")

    def statfs(self) -> bytes:
        return abi.statfs_out(self.source.statfs())

    # --- files --------------------------------------------------------------------------------
    def open(self, node: int, flags: int) -> bytes:
        if flags & os.O_ACCMODE != os.O_RDONLY:
            raise _errno(errno.EROFS)
        info = self._require(self.nodes.path(node))[0]
        if info.is_dir:
            raise _errno(errno.EISDIR)
        if self.no_open:
            raise _errno(errno.ENOSYS)  # see init; the open itself succeeds
        handle = next(self._next_handle)
        self._handles[handle] = self.source.open_info(info)
        return abi.open_out(handle, abi.FOPEN_KEEP_CACHE)

    def read(self, node: int, handle: int, offset: int, view: memoryview) -> int:
        if handle == 0:  # an open the kernel did not tell us about
            member = self.source.open_info(self._require(self.nodes.path(node))[0])
            try:
                return member.preadinto(offset, view)
            finally:
                member.close()
        member = self._handles.get(handle)
        if member is None:
            raise _errno(errno.EBADF)
        return member.preadinto(offset, view)

    def release(self, handle: int) -> None:
        member = self._handles.pop(handle, None)
        if member is not None:
            member.close()

    # --- folders ------------------------------------------------------------------------------
    def opendir(self, node: int) -> bytes:
        path = self.nodes.path(node)
        entries = self.source.list_entries(path)
        if entries is None:
            self._require(path)
            raise _errno(errno.ENOTDIR)
        own = self._require(path)
        parent_path = path.rsplit("/", 1)[0] or "/"
        parent = self._entry(parent_path) if path != "/" else own
        prefix = "/" if path == "/" else path + "/"
        pack = abi.pack_attr
        listing: List[Listed] = [(b".", "", own[0], b""), (b"..", "", (parent or own)[0], b"")]
        listing.extend(
            (name.encode(ENCODING, "surrogateescape"), prefix + name, info, pack(info)) for name, info in entries
        )
        handle = next(self._next_handle)
        self._listings[handle] = listing
        return abi.open_out(handle, abi.FOPEN_KEEP_CACHE | abi.FOPEN_CACHE_DIR)

    def readdir(self, handle: int, size: int, offset: int, plus: bool) -> bytes:
        """One page of the listing from entry ``offset`` on, at most ``size`` bytes. With
        ``plus``, entries carry their attributes and a node id the kernel now holds."""
        listing = self._listings.get(handle)
        if listing is None:
            raise _errno(errno.EBADF)
        records: List[bytes] = []
        used = 0
        position = offset
        taken: List[Listed] = []
        head = abi.ENTRY_SIZE if plus else 0
        while position < len(listing):
            item = listing[position]
            need = head + ((abi.DIRENT_HEAD_SIZE + len(item[0]) + 7) & ~7)
            if used + need > size:
                break
            used += need
            taken.append(item)
            position += 1
        if plus:
            paths = [item[1] for item in taken if item[1]]
            nodes = iter(self.nodes.remember_all(paths))
            timeout = self._timeout
            for index, (name, path, info, attr) in enumerate(taken, start=offset + 1):
                if path:
                    node = next(nodes)
                    if not info.ino:
                        attr = abi.pack_attr(info._replace(ino=node))
                    records.append(abi.entry_out(node, attr, timeout))
                else:  # "." and "..": no node id, nothing for the kernel to count
                    records.append(abi.entry_out(0, abi.NEGATIVE_ATTR, 0))
                records.append(abi.dirent(info.ino or UNKNOWN_INO, index, name, info.mode))
        else:
            for index, (name, _path, info, _attr) in enumerate(taken, start=offset + 1):
                records.append(abi.dirent(info.ino or UNKNOWN_INO, index, name, info.mode))
        return b"".join(records)

    def releasedir(self, handle: int) -> None:
        self._listings.pop(handle, None)


__all__ = ["LowLevelOperations", "ROOT_ID", "TIMEOUT"]
