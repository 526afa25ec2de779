"""Partial indexes (and converted archives) left behind by builds that were killed.

An index is written to ``<index>.tmp-<hex>`` and renamed into place when complete; a build that
ends with an exception or a signal Python sees removes its file. A build killed outright
(SIGKILL, the out-of-memory killer, a batch job's time limit, a node that went down) cannot, and
its partial file, as large as the index would have been, stayed beside the archive for good.

The next build of the same index removes such files. A partial file is known to be abandoned
when nobody holds a lock on it: the writer's SQLite connection runs in exclusive locking mode,
so it holds a POSIX write lock on the file from its first write until it closes, and the kernel
drops that lock when the process dies. The check asks with ``F_OFD_GETLK``, which sees locks of
other processes and of this one, and does not take a lock itself. Files this process is writing
are skipped without being opened (closing any descriptor of a file drops the process's POSIX
locks on it). A file changed in the last ``MIN_AGE`` seconds is left alone too: between
creating its file and its first write a new build holds no lock yet, and on file systems whose
locks are local to one client (Lustre's ``localflock``, NFS with ``nolock``) a build on another
node shows none. Where the file system cannot answer (no ``F_OFD_GETLK``, locks unsupported),
nothing is removed. The converter writes its output the same way and locks it with
``hold_lock``; the same rules apply to it.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import stat
import struct
import time
from typing import List, Optional, Set

logger = logging.getLogger(__name__)

#: Seconds a partial index must have gone unchanged before it may be taken for abandoned.
MIN_AGE = 600.0

_OFD_GETLK = getattr(fcntl, "F_OFD_GETLK", None)
_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", None)
#: struct flock: l_type, l_whence, l_start, l_len, l_pid (then the padding to 32 bytes on Linux).
_FLOCK = "@hhqqi"
_FLOCK_SIZE = 32

#: The partial files this process is writing. No lock: ``unregister`` also runs from a writer's
#: ``weakref.finalize``, which the garbage collector may call in a thread that is inside one of
#: these functions; a set's add, discard and ``in`` are atomic on their own.
_writing: Set[str] = set()


def register(temp_path: str) -> None:
    """Mark ``temp_path`` as being written by this process."""
    _writing.add(os.path.abspath(temp_path))


def unregister(temp_path: str) -> None:
    _writing.discard(os.path.abspath(temp_path))


def _is_ours(path: str) -> bool:
    return os.path.abspath(path) in _writing


def _flock(kind: int) -> bytes:
    packed = struct.pack(_FLOCK, kind, os.SEEK_SET, 0, 0, 0)
    return packed + bytes(_FLOCK_SIZE - len(packed))


def hold_lock(fd: int) -> None:
    """Lock a partial file that ``fd`` (open for writing) writes, as SQLite's exclusive mode
    does an index's, so that other processes see it is in use (the converter's output). The
    lock goes with the last descriptor of this open, or with the process."""
    if _OFD_SETLK is None:
        return
    try:
        fcntl.fcntl(fd, _OFD_SETLK, _flock(fcntl.F_WRLCK))
    except OSError as error:  # (no locks here: others cannot tell, and so remove nothing)
        logger.debug("No lock on the file being written (fd %d): %s", fd, error)


def _lock_seen(path: str) -> Optional[bool]:
    """Whether a process holds a lock on ``path``; None when that cannot be told."""
    if _OFD_GETLK is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        answer = fcntl.fcntl(fd, _OFD_GETLK, _flock(fcntl.F_WRLCK))
    except OSError:  # (no locks on this file system)
        return None
    finally:
        os.close(fd)
    return struct.unpack_from(_FLOCK, answer)[0] != fcntl.F_UNLCK


def build_in_progress(final_path: str) -> Optional[str]:
    """A partial file of ``final_path`` that another process is writing now (it holds the file's
    lock), or None. Where locks are not seen (another node on a file system whose locks are
    local to each client) it says None, and the caller builds as if alone."""
    for path in partial_files(final_path):
        if not path.endswith("-journal") and not _is_ours(path) and _lock_seen(path):
            return path
    return None


def partial_files(final_path: str) -> List[str]:
    """The partial files of writes of ``final_path`` in its folder (``<final>.tmp-<hex>`` and
    their ``-journal`` files)."""
    folder, base = os.path.split(final_path)
    pattern = re.compile(re.escape(base) + r"\.tmp-[0-9a-f]+(-journal)?")
    try:
        names = os.listdir(folder or ".")
    except OSError:
        return []
    return [os.path.join(folder, name) for name in names if pattern.fullmatch(name)]


def remove_abandoned(final_path: str, now: float | None = None) -> List[str]:
    """Remove the partial files of ``final_path`` (an index, a converted archive) left by
    writers that are gone; returns them."""
    now = time.time() if now is None else now
    removed = []
    for path in partial_files(final_path):
        main = path.removesuffix("-journal")  # (SQLite locks the database, not its journal)
        if _is_ours(main):
            continue
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode) or now - info.st_mtime < MIN_AGE:
            continue
        if _lock_seen(main if main != path and os.path.lexists(main) else path) is not False:  # (held, or unknown)
            continue
        try:
            os.unlink(path)
        except OSError as error:
            if error.errno in (errno.EACCES, errno.EPERM):  # (another user's, in a shared folder)
                logger.debug("Could not remove %s, left by a build that was interrupted: %s", path, error)
            elif error.errno != errno.ENOENT:
                logger.warning("Could not remove %s, left by a build that was interrupted: %s", path, error)
            continue
        logger.info("Removed %s (%d bytes), left by a build that was interrupted", path, info.st_size)
        removed.append(path)
    return removed
