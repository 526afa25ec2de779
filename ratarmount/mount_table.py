"""The process's mount table (``/proc/self/mountinfo``): which file system holds a path, and
what is mounted at a mount point.

Read here rather than through ``os.path.ismount`` or ``/proc/mounts``: ``ismount`` compares the
devices of a folder and its parent, so it misses a bind mount of a folder of the same file
system, and only mountinfo names the file system type of each mount in order.
"""

from __future__ import annotations

import os
from typing import Iterator, Optional, Tuple

#: The file system type of a ratarmount mount (libfuse's ``subtype=ratarmount``).
OUR_TYPE = "fuse.ratarmount"


def unescape(field: str) -> str:
    """Mount points in mountinfo have space, tab, newline and backslash as octal escapes."""
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def read_mountinfo() -> str:
    """This process's mount table ("" when it cannot be read)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            return f.read()
    except OSError:
        return ""


def mounts(mountinfo: str) -> Iterator[Tuple[str, str]]:
    """(mount point, file system type) of each mount, in the table's order: of mounts on the
    same point, the later one hides the earlier ones."""
    for line in mountinfo.splitlines():
        head, separator, tail = line.partition(" - ")
        fields = head.split(" ")
        if separator and len(fields) >= 5 and tail:
            yield unescape(fields[4]), tail.split(" ")[0]


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
    for point, kind in mounts(mountinfo):
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best:  # (later mounts over the same point hide earlier ones)
            best, found = len(point), kind
    return found


def mounted_at(point: str, mountinfo: Optional[str] = None) -> Optional[str]:
    """The type of the file system mounted at ``point`` itself (a real path), the topmost
    where several are; None when nothing is mounted there, or the table cannot be read."""
    if mountinfo is None:
        mountinfo = read_mountinfo()
    found = None
    for mounted, kind in mounts(mountinfo):
        if mounted == point:
            found = kind
    return found
