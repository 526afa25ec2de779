"""Reply payloads of the FUSE kernel protocol (``linux/fuse.h``), packed in Python.

The low-level front-end answers LOOKUP, GETATTR, READDIR(PLUS), OPEN and STATFS with these bytes
through ``fuse_reply_buf``: one ``struct.pack`` per entry instead of a C structure filled field by
field, and a whole directory page in one reply. The layouts are the protocol's (stable since
7.9, host byte order); the kernel rejects replies of the wrong size, so a mistake here fails
loudly, never silently.
"""

from __future__ import annotations

import stat
import struct
from typing import Dict, Tuple

from ratarmountcore.index import dirents
from ratarmountcore.sources.base import FileInfo

#: struct fuse_attr (the kernel reads the u64 times as signed)
_ATTR = struct.Struct("=QQQqqqIIIIIIIIII")  # times are signed in practice (pre-1970)
#: struct fuse_entry_out without its fuse_attr: nodeid, generation, entry_valid, attr_valid, nsecs
_ENTRY_HEAD = struct.Struct("=QQQQII")
#: struct fuse_attr_out without its fuse_attr
_ATTR_HEAD = struct.Struct("=QII")
#: struct fuse_dirent without its name
_DIRENT = struct.Struct("=QQII")
#: struct fuse_open_out
_OPEN = struct.Struct("=QII")
#: struct fuse_statfs_out (struct fuse_kstatfs)
_STATFS = struct.Struct("=QQQQQIIII24x")

ATTR_SIZE = _ATTR.size  # 88
ENTRY_SIZE = _ENTRY_HEAD.size + ATTR_SIZE  # 128
DIRENT_HEAD_SIZE = _DIRENT.size  # 24

FOPEN_KEEP_CACHE = 1 << 1
FOPEN_CACHE_DIR = 1 << 3

#: struct fuse_out_header followed by struct fuse_notify_store_out
_NOTIFY_STORE = struct.Struct("=IiQQQII")
#: enum fuse_notify_code
FUSE_NOTIFY_STORE = 4


def notify_store(node: int, offset: int, size: int) -> bytes:
    """The head of a message that puts ``size`` bytes (which follow it) into the kernel's page
    cache of ``node`` at ``offset``; written to the FUSE device like a reply, unasked."""
    return _NOTIFY_STORE.pack(_NOTIFY_STORE.size + size, FUSE_NOTIFY_STORE, 0, node, offset, size, 0)


def _attr_fields(
    ino: int, mode: int, size: int, mtime_ns: int, uid: int, gid: int, nlink: int, rdev: int, blocks: int
) -> Tuple[int, ...]:
    """The fields of ``struct fuse_attr``, from an entry's attributes shown with inode number ``ino``."""
    seconds, nanoseconds = divmod(mtime_ns, 1_000_000_000)
    return (
        ino, size, blocks, seconds, seconds, seconds, nanoseconds, nanoseconds, nanoseconds,
        mode, nlink, uid, gid, rdev, 4096, 0,
    )  # fmt: skip


def _attr_values(info: FileInfo, ino: int) -> Tuple[int, ...]:
    """The fields of ``struct fuse_attr`` for ``info``, shown with inode number ``ino``."""
    return _attr_fields(
        ino, info.mode, info.size, info.mtime_ns, info.uid, info.gid, info.nlink, info.rdev, info.st_blocks
    )


def pack_attr(info: FileInfo) -> bytes:
    """``struct fuse_attr`` of ``info``."""
    return _ATTR.pack(*_attr_values(info, info.ino))


def entry_out(node: int, attr: bytes, timeout: int) -> bytes:
    """``struct fuse_entry_out``: a found name (``node`` > 0) or, with node 0, a cached miss."""
    return _ENTRY_HEAD.pack(node, 0, timeout, timeout, 0, 0) + attr


def entry_out_of(
    node: int, timeout: int, ino: int,
    mode: int, size: int, mtime_ns: int, uid: int, gid: int, nlink: int, rdev: int, blocks: int,
) -> bytes:  # fmt: skip
    """``entry_out`` from plain fields (a ``StatRow``'s), the attributes as ``pack_attr`` makes them."""
    attr = _ATTR.pack(*_attr_fields(ino, mode, size, mtime_ns, uid, gid, nlink, rdev, blocks))
    return entry_out(node, attr, timeout)


NEGATIVE_ATTR = bytes(ATTR_SIZE)
#: The entry part of a READDIRPLUS record that names no node (node id 0: the kernel lists the
#: name and links nothing).
NO_ENTRY = bytes(ENTRY_SIZE)


def attr_out(attr: bytes, timeout: int) -> bytes:
    return _ATTR_HEAD.pack(timeout, 0, 0) + attr


def open_out(handle: int, flags: int) -> bytes:
    return _OPEN.pack(handle, flags, 0)


#: ``struct fuse_dirent`` padded to 8 bytes, from (ino, offset, name, mode): the layout the
#: index keeps packed listings in.
dirent = dirents.record


#: struct fuse_direntplus (entry_out with its attr, then the dirent head) in one call
_PLUS = struct.Struct("=QQQQII" + _ATTR.format[1:] + _DIRENT.format[1:])


_PLUS_BY_LENGTH: Dict[int, struct.Struct] = {}


def direntplus(node: int, info: FileInfo, timeout: int, offset: int, name: bytes, ino: int) -> bytes:
    """A READDIRPLUS record: the entry with its attributes and node id, padded to 8 bytes."""
    return direntplus_of(
        node, timeout, offset, name, ino,
        info.mode, info.size, info.mtime_ns, info.uid, info.gid, info.nlink, info.rdev, info.st_blocks,
    )  # fmt: skip


def direntplus_of(
    node: int, timeout: int, offset: int, name: bytes, ino: int,
    mode: int, size: int, mtime_ns: int, uid: int, gid: int, nlink: int, rdev: int, blocks: int,
) -> bytes:  # fmt: skip
    """``direntplus`` from plain fields (listings of a source's ``StatRow``s need no FileInfo).

    One ``pack`` per record with the name (zero-padded by the format) included: listings make one
    record per entry, and the generic path (attribute tuple, concatenation, padding) cost twice
    as much."""
    length = len(name)
    packer = _PLUS_BY_LENGTH.get(length)
    if packer is None:
        packer = _PLUS_BY_LENGTH[length] = struct.Struct(_PLUS.format + f"{(length + 7) & ~7}s")
    seconds, nanoseconds = divmod(mtime_ns, 1_000_000_000)
    return packer.pack(
        node, 0, timeout, timeout, 0, 0,
        ino, size, blocks, seconds, seconds, seconds, nanoseconds, nanoseconds, nanoseconds,
        mode, nlink, uid, gid, rdev, 4096, 0,
        ino, offset, length, stat.S_IFMT(mode) >> 12, name,
    )  # fmt: skip


def direntplus_name_only(offset: int, name: bytes, ino: int, mode: int) -> bytes:
    """A READDIRPLUS record with node id 0 and no attributes: the kernel lists the name (with
    its inode number and type) and links no inode for it; a later ``stat`` looks it up."""
    return NO_ENTRY + dirent(ino, offset, name, mode)


def statfs_out(values: dict) -> bytes:  # type: ignore[type-arg]
    get = values.get
    return _STATFS.pack(
        get("f_blocks", 0),
        get("f_bfree", 0),
        get("f_bavail", 0),
        get("f_files", 0),
        get("f_ffree", 0),
        get("f_bsize", 4096),
        get("f_namemax", 255),
        get("f_frsize", 4096),
        0,
    )
