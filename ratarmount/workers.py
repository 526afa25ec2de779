"""Worker threads of libfuse's multi-threaded loop: how many, from ``-o max_threads=N``.

Kept apart from ``lowlevel.py`` so that the CLI can check the options before it opens (and
maybe indexes) an archive, without loading libfuse.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Sequence, Tuple

from ratarmountcore.cores import usable_cores
from ratarmountcore.errors import RatarmountError
from ratarmountcore.io.mountinfo import file_system_type, read_mountinfo

logger = logging.getLogger(__name__)

#: ``-o`` options of libfuse's multi-threaded loop (``fuse_loop_config``).
LOOP_OPTIONS = ("max_threads", "max_idle_threads")
#: At most this many worker threads by default, however many cores there are.
MAX_THREADS_CAP = 16
#: At least this many by default for archives on network or parallel file systems.
NETWORK_MIN_THREADS = 8
#: File system types (``/proc/self/mountinfo``) whose cold reads go over a network: Lustre,
#: GPFS, BeeGFS, NFS and the like, and FUSE clients of remote storage.
NETWORK_FILE_SYSTEMS = frozenset(
    {
        "lustre", "gpfs", "beegfs", "nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "afs",
        "panfs", "orangefs", "pvfs2", "wekafs", "9p", "fuse.glusterfs", "fuse.sshfs", "fuse.s3fs",
        "fuse.gcsfuse", "fuse.rclone", "fuse.juicefs", "fuse.cvmfs2",
    }
)  # fmt: skip


def default_max_threads(archives: Sequence[str] = ()) -> int:
    """One worker thread per usable core (at least 2, at most ``MAX_THREADS_CAP``); at least
    ``NETWORK_MIN_THREADS`` when an archive lies on a network or parallel file system.

    Python runs one thread at a time, and every worker woken by a request wants the GIL at
    once; more workers than cores only queue for it, handing it over at every ``pread`` and
    SQLite call. Measured on 2 cores with the archive on a local disk, 8 processes reading
    4,000 random files from a fresh mount (median of 4, interleaved): 2 threads 0.73 s, 3: 0.78
    s, 4: 0.86 s, 8: 1.05 s, 32 (libfuse's usual setting): 1.14-1.16 s; one reader, a stat of
    every file and ``find`` did not change. A second thread is needed: one lookup may wait for
    the listing that another worker serves (``lowlevel_ops``).

    A worker waits in ``pread`` for as long as a cold read takes, so the workers bound the
    reads in flight: ~0.1 ms each on a local disk, a millisecond and more on a parallel file
    system. With the archive behind a pass-through FUSE file system that delays every read by
    1 ms (this machine has no network file system), the same 8 readers took 2.97 s with 2
    workers, 1.21 s with 8 and 1.40 s with 16; one reader 1.55 s either way. ``-o
    max_threads=N`` decides either way."""
    threads = max(2, min(usable_cores(), MAX_THREADS_CAP))
    if threads >= NETWORK_MIN_THREADS or not archives:
        return threads
    mounts = read_mountinfo()  # once: a union of hundreds of archives, a node with many mounts
    for archive in archives:
        kind = file_system_type(archive, mounts)
        if kind in NETWORK_FILE_SYSTEMS:
            logger.debug("%s is on %s: %d worker threads instead of %d", archive, kind, NETWORK_MIN_THREADS, threads)
            return NETWORK_MIN_THREADS
    return threads


def loop_threads(fuse_options: Dict[str, Any], archives: Sequence[str] = ()) -> Tuple[int, int]:
    """``-o max_threads=N,max_idle_threads=M``: the loop's worker threads at most (default
    ``default_max_threads(archives)``), and idle ones kept (default: all of them). libfuse
    3.12+ takes them through ``fuse_loop_config``, not ``fuse_session_new``."""
    values: List[int] = []
    for key in LOOP_OPTIONS:
        if key in fuse_options:
            text = fuse_options[key]
        else:
            text = values[0] if values else default_max_threads(archives)
        try:
            value = int(text)
        except (TypeError, ValueError):
            value = -1
        if value < 1:
            raise RatarmountError(f"-o {key}={text}: expected a whole number of threads, at least 1")
        values.append(value)
    return values[0], values[1]
