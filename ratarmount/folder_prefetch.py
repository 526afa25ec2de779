"""Whole folders handed to the kernel while a process looks up their files one by one.

FUSE has no way to push names into the kernel's dentry cache; a listing with attributes
(READDIRPLUS) is the only bulk path. A program that stats or opens every file of a folder without
listing it first (a file list read from a manifest, ``stat`` of every path of a tree) costs one
LOOKUP round trip per file: ~30-100 us each on a small VM, dominated by the two thread wake-ups,
not by our work. When lookups come in a run within one folder, the mount lists that folder
itself, from a thread of its own through the mount point: the kernel then holds every entry
with its attributes, and the rest of the run is answered from its caches without a round trip.

Only folders of up to ``FOLDER_MAX`` entries are listed (a lookup run in a flat folder of a
million files must not make the kernel cache a million inodes), each at most once while it is
remembered (the kernel keeps what it learned for a day on an immutable mount). Listing goes
through the kernel like any other process's, so it is answered by the FUSE worker threads;
failures (the mount point hidden or gone, a folder we may not read) only mean the lookups
continue as before.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import threading
from typing import Callable, Optional, Tuple

logger = logging.getLogger(__name__)

#: Largest folder listed on behalf of a lookup run (ImageNet's class folders hold ~1,300 files).
FOLDER_MAX = 4096
#: Folders remembered as listed (the oldest are forgotten first).
REMEMBERED = 4096
_STOP = None


class FolderPrefetcher:
    """Lists folders of the mount at ``mountpoint`` (an absolute path) in a background thread."""

    def __init__(self, mountpoint: str) -> None:
        self.mountpoint = mountpoint.rstrip("/")
        self._queue: "queue.SimpleQueue[Optional[Tuple[str, Optional[threading.Event], int]]]" = queue.SimpleQueue()
        #: Drops the kernel's cached listing of a folder node (set by the front-end).
        self.invalidate: Optional[Callable[[int], None]] = None
        #: The native thread id the kernel sees for our listings (0 before the first).
        self.thread_id = 0
        self._listed: "collections.OrderedDict[str, None]" = collections.OrderedDict()
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._closed = False
        self.listings = 0

    def request(self, path: str, entries: int, done: Optional[threading.Event] = None, stale: int = 0) -> bool:
        """A lookup run began in folder ``path`` (of ``entries`` entries): list it unless it is
        too large or was listed already (then False). ``done`` is set once it was listed."""
        if entries > FOLDER_MAX or entries < 2:
            return False
        with self._lock:
            if self._closed or (path in self._listed and not stale):
                return False
            self._listed[path] = None
            if len(self._listed) > REMEMBERED:
                self._listed.popitem(last=False)
            if self._thread is None:  # started on first use: the daemon forks after we are made
                self._thread = threading.Thread(target=self._run, name="ratarmount-folder-prefetch", daemon=True)
                self._thread.start()
        self._queue.put((path, done, stale))
        return True

    def _run(self) -> None:
        self.thread_id = threading.get_native_id()
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            path, done, stale = item
            try:
                if stale and self.invalidate is not None:
                    self.invalidate(stale)
                os.listdir(self.mountpoint + path)
                self.listings += 1
            except OSError as exc:
                logger.debug("could not list %s for the lookups in it: %s", path, exc)
            finally:
                if done is not None:
                    done.set()

    def close(self) -> None:
        """Stop the thread after the listing in progress. Not waited for: at the end of a session
        that listing may wait for a reply no worker will send (the kernel fails it when the
        session's device is closed)."""
        with self._lock:
            self._closed = True
            started = self._thread is not None
        if started:
            self._queue.put(_STOP)
