"""Keep an index file in the page cache while it is in use (a hint, never a requirement).

A lookup reads two or three pages of the index. When those pages are in the page cache that costs
a few microseconds; when they are not -- a fresh node, or the page cache was emptied by the
dataset's own reads or by ``drop_caches`` -- every lookup waits for its own 16 KiB disk read
(~100 us on a local SSD, milliseconds on Lustre), and 1,000 random opens pay that 1,500 times.
Reading the whole index once in order costs one sequential pass (16 MiB for 100,000 members:
8 ms here), which every file system, Lustre most of all, serves far better than scattered page
reads.

So the pool asks :meth:`IndexWarmer.poke` on every query. At most every ``PROBE_INTERVAL`` it
probes a few pages of the file with ``mincore`` on an untouched mapping of it (where that fails,
with ``preadv(RWF_NOWAIT)``, which fails with EAGAIN instead of reading from disk when a page is
not cached, but starts a read-ahead that a fast disk may finish before it returns). When a probe
misses, a background thread pulls the whole file into the page cache with ``sendfile`` to
``/dev/null``: no buffer of ours, so the process's memory does not grow, and the GIL is released
while it reads. Limits: a file larger than a quarter of the available memory is never read
ahead; read-aheads are paid from a budget of two files' worth that fills up at ``REWARM_RATE``
(a machine short of memory must not read the index over and over), and pages found missing
right after a complete read-ahead pause the probes for a minute (a file system whose probe
always fails, or a machine that evicts as fast as we read).
Where ``RWF_NOWAIT`` or ``sendfile`` is not supported, the warmer turns itself off.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import mmap
import os
import random
import threading
import time
from typing import Callable, List, Optional, Tuple

from ..io import forks

logger = logging.getLogger(__name__)

#: Seconds between two probes of the page cache.
PROBE_INTERVAL = 0.05
#: Pages probed each time.
PROBES = 6
#: Read-aheads are paid from a budget of bytes that holds two files' worth and fills up at this
#: many bytes per second: two read-aheads at once at most, then on average no more than this.
REWARM_RATE = 4 << 20
#: Pages found missing this soon after a complete read-ahead (seconds) ...
UNRELIABLE_WITHIN = 0.25
#: ... pause the probes for this long (seconds).
PAUSE = 60.0
#: A file larger than this share of MemAvailable is not read ahead.
MAX_SHARE_OF_MEMORY = 0.25
#: Smaller indexes are not read ahead: a lookup reads a good part of one anyway, and a folder of
#: 1,000 small class tars read at random after ``drop_caches`` started 1,000 threads (1,000
#: random reads in-process 0.43 -> 0.64 s).
MIN_SIZE = 1 << 20
#: Read-aheads at once in the process (a union of many large indexes reads them in turn).
MAX_RUNNING = 2
#: Bytes per sendfile call (the thread checks for close between calls).
CHUNK = 4 << 20

_PAGE = 4096


def _resident(fd: int, size: int, offsets: List[int]) -> Optional[bool]:
    """Whether the pages at ``offsets`` of the file are all in the page cache, by mincore(2) on a
    mapping that is never touched: no I/O and no read-ahead. None when it cannot tell. (A probe
    by ``preadv(RWF_NOWAIT)`` starts the kernel's read-ahead of a missing page, and on a fast
    virtual disk that read can finish before the call returns: the page then counted as cached,
    and an evicted index was not read ahead; found by a flaky test in session 25.)"""
    mincore = _mincore()
    if mincore is None or size <= 0:
        return None
    try:
        mapped = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)  # (private: never written, no memory)
    except (OSError, ValueError):
        return None
    try:
        anchor = ctypes.c_char.from_buffer(mapped)
        base = ctypes.addressof(anchor)
        vector = ctypes.create_string_buffer(1)
        try:
            for offset in offsets:
                if mincore(base + offset, _PAGE, vector) != 0:
                    return None
                if not vector.raw[0] & 1:
                    return False
            return True
        finally:
            del anchor  # (the mapping cannot be closed while exported)
    finally:
        mapped.close()


@functools.cache
def _mincore() -> Optional[Callable[..., int]]:
    """libc's mincore, or None where there is none."""
    try:
        function = ctypes.CDLL(None, use_errno=True).mincore
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    function.restype = ctypes.c_int
    return function  # type: ignore[no-any-return]


_RUNNING = threading.BoundedSemaphore(MAX_RUNNING)


def _new_semaphore_in_child() -> None:
    global _RUNNING
    _RUNNING = threading.BoundedSemaphore(MAX_RUNNING)  # (the parent's threads are not here)


forks.in_child(_new_semaphore_in_child)


def available_memory() -> Optional[int]:
    """MemAvailable from /proc/meminfo in bytes, or None where there is none."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class IndexWarmer:
    """Reads ``path`` into the page cache whenever a probe finds some of it missing there."""

    def __init__(self, path: str, identity: Tuple[int, int], size: int) -> None:
        self.path = path
        #: (device, inode) of the file the pool reads: a file replaced at ``path`` is left alone.
        self._identity = identity
        self._size = size
        self._enabled = size >= MIN_SIZE and all(hasattr(os, name) for name in ("RWF_NOWAIT", "preadv", "sendfile"))
        self._next_probe = 0.0
        self._budget = 2.0 * size
        self._budget_time = time.monotonic()
        #: When the last read-ahead completed (monotonic).
        self._warmed_at = -UNRELIABLE_WITHIN
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._closed = False
        self._random = random.Random(0x5EED)
        self._byte = bytearray(1)
        #: Read-aheads started (for tests and ``--debug``).
        self.warm_count = 0

    def _open(self) -> int:
        """A descriptor of the file the pool reads (the file is opened only while in use, so a
        union of many archives does not hold one more descriptor per index); -1 when the path
        names another file now or none."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return -1
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != self._identity:
            os.close(fd)
            return -1
        return fd

    def poke(self) -> None:
        """Cheap unless a probe is due: then probe, and start a read-ahead if pages are missing."""
        if not self._enabled:
            return
        now = time.monotonic()
        if now < self._next_probe or not self._lock.acquire(blocking=False):
            return
        try:
            if self._closed or now < self._next_probe:
                return
            self._next_probe = now + PROBE_INTERVAL
            if self._thread is not None or self._cached():
                return
            if now < self._warmed_at + UNRELIABLE_WITHIN:
                # Missing again right after a complete read-ahead: the probe cannot be trusted
                # here (a file system that answers EAGAIN to every RWF_NOWAIT read), or the
                # machine evicts as fast as we read. Either way, reading again now would not help.
                logger.debug("%s: pages missing right after a read-ahead; pausing", self.path)
                self._next_probe = now + PAUSE
                return
            self._budget = min(2.0 * self._size, self._budget + (now - self._budget_time) * REWARM_RATE)
            self._budget_time = now
            if self._budget >= self._size:
                self._start_warm()
        finally:
            self._lock.release()

    def _cached(self) -> bool:
        """Whether every probed page is in the page cache (the first and last, and random ones)."""
        fd = self._open()
        if fd < 0:
            self._enabled = False
            return True
        pages = (self._size + _PAGE - 1) // _PAGE
        offsets = [0, (pages - 1) * _PAGE] + [self._random.randrange(pages) * _PAGE for _ in range(PROBES - 2)]
        resident = _resident(fd, self._size, offsets)
        if resident is not None:
            os.close(fd)
            return resident
        try:
            for offset in offsets:
                os.preadv(fd, [self._byte], offset, os.RWF_NOWAIT)
        except BlockingIOError:
            return False
        except OSError as exc:  # EOPNOTSUPP and the like: this file system cannot tell
            logger.debug("%s: cannot probe the page cache (%s); no read-ahead", self.path, exc)
            self._enabled = False
        finally:
            os.close(fd)
        return True

    def _start_warm(self) -> None:
        available = available_memory()
        if available is not None and self._size > available * MAX_SHARE_OF_MEMORY:
            return
        running = _RUNNING
        if not running.acquire(blocking=False):
            return  # others are reading ahead: probed again later
        self._budget -= self._size
        self.warm_count += 1
        logger.debug("%s: not all in the page cache; reading its %d bytes ahead", self.path, self._size)
        self._thread = threading.Thread(target=self._warm, args=(running,), name="ratarmount-index-ahead", daemon=True)
        self._thread.start()

    def _warm(self, running: threading.BoundedSemaphore) -> None:
        fd = self._open()
        offset = 0
        try:
            if fd >= 0:
                with open(os.devnull, "wb") as null:
                    while offset < self._size and not self._closed:
                        sent = os.sendfile(null.fileno(), fd, offset, min(CHUNK, self._size - offset))
                        if sent <= 0:
                            break
                        offset += sent
        except OSError as exc:
            logger.debug("%s: read-ahead stopped (%s); no more", self.path, exc)
            self._enabled = False
        finally:
            if fd >= 0:
                os.close(fd)
            # (Released before the warmer shows idle: a probe right after the read-ahead ended
            # found the place still taken and started none; found by a flaky test.)
            running.release()  # (the semaphore it took, whatever the module holds by now)
            with self._lock:
                self._thread = None
                if offset >= self._size:
                    self._warmed_at = time.monotonic()

    def close(self) -> None:
        """Stop: no more probes; a read-ahead under way ends after its current chunk."""
        with self._lock:
            self._closed = True
            self._enabled = False
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
