"""The process's mount table (``/proc/self/mountinfo``): which file system holds a path, what
is mounted at a mount point, and where the cgroup hierarchies are (``cores``).

Read here rather than through ``os.path.ismount`` or ``/proc/mounts``: ``ismount`` compares the
devices of a folder and its parent, so it misses a bind mount of a folder of the same file
system, and only mountinfo gives each mount's root in its file system and its type, in order.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator, Optional, Tuple


@dataclass(frozen=True)
class Mount:
    #: Where it is mounted.
    point: str
    #: The folder of its file system mounted there (a cgroup's path for a cgroup mount).
    root: str
    #: The file system type (``fuse.ratarmount``, ``cgroup2``, ...).
    kind: str
    #: The file system's own options (a cgroup v1 mount's controllers).
    super_options: Tuple[str, ...]


def unescape(field: str) -> str:
    """Paths in mountinfo have space, tab, newline and backslash as octal escapes."""
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def read_mountinfo(root: str = "/") -> str:
    """This process's mount table ("" when it cannot be read); ``root``: where ``/proc`` is
    (tests pass a tree of their own)."""
    try:
        with open(os.path.join(root, "proc/self/mountinfo"), encoding="utf-8", errors="surrogateescape") as f:
            return f.read()
    except OSError:
        return ""


def mounts(mountinfo: str) -> Iterator[Mount]:
    """Each mount, in the table's order: of mounts on the same point, the later one hides the
    earlier ones."""
    for line in mountinfo.splitlines():
        head, separator, tail = line.partition(" - ")
        fields, rest = head.split(" "), tail.split(" ")
        if separator and len(fields) >= 5 and tail:
            options = tuple(rest[2].split(",")) if len(rest) >= 3 else ()
            yield Mount(unescape(fields[4]), unescape(fields[3]), rest[0], options)


def file_system_type(path: str, mountinfo: Optional[str] = None) -> str:
    """The type of the file system that holds ``path`` ("" when it cannot be told): the mount
    with the longest mount point above the path's real location in ``mountinfo`` (default:
    this process's)."""
    if mountinfo is None:
        mountinfo = read_mountinfo()
    try:
        target = os.path.realpath(path)
    except OSError:
        return ""
    best, found = -1, ""
    for mount in mounts(mountinfo):
        point = mount.point
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best:  # (later mounts over the same point hide earlier ones)
            best, found = len(point), mount.kind
    return found


def mounted_at(point: str, mountinfo: Optional[str] = None) -> Optional[str]:
    """The type of the file system mounted at ``point`` itself (a real path), the topmost
    where several are; None when nothing is mounted there, or the table cannot be read."""
    if mountinfo is None:
        mountinfo = read_mountinfo()
    found = None
    for mount in mounts(mountinfo):
        if mount.point == point:
            found = mount.kind
    return found
