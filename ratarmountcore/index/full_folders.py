"""Index folders where a build failed for want of room (or with write errors).

A build that fails so moves to the next location (``builder.open_or_build``). The folder is then
remembered for a while: the other archives of a folder of archives (``-r``) go to the next
location at once, instead of each filling the disk, failing, and being read a second time, with
a warning each. A folder has free space again once a failed build's file is removed, so its free
space cannot tell later builds that it is full.

SQLite reports "database or disk is full" for its temporary files too (the sort of a large
``CREATE INDEX`` spills to ``SQLITE_TMPDIR``, ``TMPDIR`` or ``/var/tmp``): a build that fails so
while the index's own folder has room blames the temporary folder, not the location, and is
not tried again elsewhere, where it would fail the same way.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import threading
import time
from typing import Dict, Optional, Tuple

logger = logging.getLogger(__name__)

#: How long a folder found full is passed over (seconds).
REMEMBERED_FOR = 600.0
#: A folder with less room than this, when a build there failed with "disk is full", is full.
FULL_BELOW = 1 << 20

#: SQLite's primary result codes: SQLITE_IOERR (a quota, EDQUOT, is one) and SQLITE_FULL.
_SQLITE_IOERR = 10
_SQLITE_FULL = 13
#: Errors of creating a file for want of room.
_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)

_remembered: Dict[str, Tuple[float, str]] = {}
_lock = threading.Lock()


def _code(exc: sqlite3.Error) -> Optional[int]:
    code = getattr(exc, "sqlite_errorcode", None)  # (Python 3.11 and later)
    if code is not None:
        return int(code) & 0xFF
    text = str(exc)
    if "disk is full" in text:
        return _SQLITE_FULL
    return _SQLITE_IOERR if "disk I/O error" in text else None


def creation_failure(exc: BaseException) -> Optional[str]:
    """Why creating an index failed for want of room, or None when it failed otherwise."""
    if isinstance(exc, OSError) and exc.errno in _SPACE_ERRNOS:
        return os.strerror(exc.errno).lower()
    if isinstance(exc, sqlite3.Error) and _code(exc) == _SQLITE_FULL:
        return "its disk is full"
    return None


def build_failure(exc: sqlite3.Error, free: Optional[int]) -> Optional[str]:
    """Why a build failed because of the index's location (``free``: bytes free there when it
    was given up), or None when it did not."""
    code = _code(exc)
    if code == _SQLITE_FULL:
        return "its disk is full" if free is None or free < FULL_BELOW else None
    if code == _SQLITE_IOERR:
        return str(exc)
    return None


def explained(exc: sqlite3.Error, free: Optional[int]) -> str:
    """Why a build failed, in words: SQLite's own, or, for "disk is full" while the index's
    folder had room (``free`` bytes when the build was given up), where SQLite's temporary
    files went and what to do."""
    if _code(exc) != _SQLITE_FULL or build_failure(exc, free) is not None:
        return str(exc)
    return (
        f"SQLite's temporary folder {temporary_folder()} is full, where the sort of a large index spills; "
        "set TMPDIR to a folder with room"
    )


def temporary_folder() -> str:
    """Where SQLite puts its temporary files (its own search order on Unix)."""
    for candidate in (os.environ.get("SQLITE_TMPDIR"), os.environ.get("TMPDIR"), "/var/tmp", "/usr/tmp", "/tmp"):
        if candidate and os.path.isdir(candidate) and os.access(candidate, os.W_OK | os.X_OK):
            return candidate
    return "."


def remember(folder: str, cause: str) -> bool:
    """Pass over ``folder`` for a while; True when it was not passed over yet (say so then)."""
    now = time.monotonic()
    with _lock:
        known = _remembered.get(folder)
        _remembered[folder] = (now, cause)
    return known is None or now - known[0] > REMEMBERED_FOR


def remembered(folder: str) -> Optional[str]:
    """Why ``folder`` is passed over, or None when it is not (any more)."""
    with _lock:
        known = _remembered.get(folder)
        if known is not None and time.monotonic() - known[0] > REMEMBERED_FOR:
            del _remembered[folder]
            known = None
    return None if known is None else known[1]
