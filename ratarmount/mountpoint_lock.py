"""One mount at a time per mount point, between the check that the point is free and the mount.

A mount checks its mount point twice: before the index is built (to fail early) and again after
(the build can take minutes). Two mounts of the same point started together passed both checks
and both mounted, stacked, when their second checks came before either mount was up (a test
that starts them together saw it about once in six runs). So the second check and the mount
happen under an exclusive ``flock`` on the mount point's folder, held until the session serves
requests: a mount started meanwhile waits for it, then finds the point taken. Where the file
system has no ``flock`` (some network file systems), the mount goes on without the lock, as
before.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time

logger = logging.getLogger(__name__)

#: The longest a mount waits for another mount of its point to be up (libfuse's mount and the
#: kernel's first request take milliseconds; a mount stuck before serving must not stop ours).
WAIT_S = 30.0
#: How often it looks meanwhile.
POLL_S = 0.01


class MountpointLock:
    """``acquire`` waits until no other mount of ours holds the folder (at most ``WAIT_S``);
    ``release`` may be called from any thread, more than once."""

    def __init__(self, mountpoint: str) -> None:
        self._mountpoint = mountpoint
        self._fd = -1
        self._lock = threading.Lock()

    def acquire(self) -> None:
        try:
            fd = os.open(self._mountpoint, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:  # (the check that follows says what is wrong with the point)
            logger.debug("Cannot open %s to lock it: %s", self._mountpoint, exc)
            return
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:  # (a mount that hangs before serving: go on)
                    logger.debug("%s stayed locked for %.0f s; mounting without the lock", self._mountpoint, WAIT_S)
                    os.close(fd)
                    return
                time.sleep(POLL_S)
            except OSError as exc:
                logger.debug("Cannot lock %s: %s", self._mountpoint, exc)
                os.close(fd)
                return
        with self._lock:
            self._fd = fd

    def release(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)  # (closing the last descriptor of the open file releases the flock)
