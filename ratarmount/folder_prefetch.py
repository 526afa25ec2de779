"""Whole folders handed to the kernel while a process looks up their files one by one.

FUSE has no way to push names into the kernel's dentry cache; a listing with attributes
(READDIRPLUS) is the only bulk path. A program that stats or opens every file of a folder without
listing it first (a file list read from a manifest, ``stat`` of every path of a tree) costs one
LOOKUP round trip per file: ~30-100 us each on a small VM, dominated by the two thread wake-ups,
not by our work. When lookups come in a run within one folder, the mount lists that folder
itself, from threads of its own through the mount point: the kernel then holds every entry
with its attributes, and the rest of the run is answered from its caches without a round trip.

Only folders of up to ``FOLDER_MAX`` entries are listed (a lookup run in a flat folder of a
million files must not make the kernel cache a million inodes), each once while it is
remembered (the kernel keeps what it learned for a day on an immutable mount), unless the
caller says that the kernel's copy of the listing is stale (``stale``). Listing goes
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
from typing import Callable, FrozenSet, List, Optional, Tuple

logger = logging.getLogger(__name__)

#: Largest folder listed on behalf of a lookup run (ImageNet's class folders hold ~1,300 files).
FOLDER_MAX = 4096
#: Folders remembered as listed (the oldest are forgotten first).
REMEMBERED = 4096
#: Listings made at once. Most of a listing's time is the kernel's (making an inode and a dentry
#: per entry, in the listing thread) and round trips, not our code: with two threads one folder's
#: entries are linked while the next folder's records are made. A stat of every file of the
#: 100,000-file tar (walked ahead, see folder_readahead.py) took 2.2-2.6 s with one, 1.7-2.2 s
#: with two on 2 cores.
THREADS = 2
_STOP = None
#: A folder to list: path, event to set when listed, stale node id, what to call before.
_Item = Tuple[str, Optional[threading.Event], int, Optional[Callable[[], None]]]


class FolderPrefetcher:
    """Lists folders of the mount at ``mountpoint`` (an absolute path) in background threads."""

    def __init__(self, mountpoint: str) -> None:
        self.mountpoint = mountpoint.rstrip("/")
        self._queue: "queue.SimpleQueue[Optional[_Item]]" = queue.SimpleQueue()
        #: Drops the kernel's cached listing of a folder node (set by the front-end).
        self.invalidate: Optional[Callable[[int], None]] = None
        #: The native thread ids the kernel sees for our listings (none before the first).
        self.thread_ids: FrozenSet[int] = frozenset()
        self._listed: "collections.OrderedDict[str, None]" = collections.OrderedDict()
        self._lock = threading.Lock()
        self._threads: List[threading.Thread] = []
        self._closed = False
        self.listings = 0

    def request(
        self,
        path: str,
        entries: int,
        done: Optional[threading.Event] = None,
        stale: int = 0,
        hold: Optional[Callable[[], None]] = None,
    ) -> bool:
        """A lookup run began in folder ``path`` (of ``entries`` entries): list it unless it is
        too large or was listed already (then False). ``done`` is set once it was listed;
        ``stale``: the folder's node id when the kernel's cached listing of it must be dropped
        first; ``hold`` is called right before the listing (once the folder's attributes are
        fetched): it may wait for the lookup the listing is for (``folder_readahead.py``)."""
        if entries > FOLDER_MAX or entries < 2:
            return False
        with self._lock:
            if self._closed or (path in self._listed and not stale):
                return False
            self._listed[path] = None
            if len(self._listed) > REMEMBERED:
                self._listed.popitem(last=False)
            if not self._threads:  # started on first use: the daemon forks after we are made
                for _ in range(THREADS):
                    thread = threading.Thread(target=self._run, name="ratarmount-folder-prefetch", daemon=True)
                    thread.start()
                    self._threads.append(thread)
        self._queue.put((path, done, stale, hold))
        return True

    def has_listed(self, path: str) -> bool:
        """Whether folder ``path`` was handed over to be listed (and is still remembered)."""
        with self._lock:
            return path in self._listed

    def _run(self) -> None:
        with self._lock:
            self.thread_ids = self.thread_ids | {threading.get_native_id()}
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            path, done, stale, hold = item
            try:
                if stale and self.invalidate is not None:
                    self.invalidate(stale)
                if hold is not None:
                    os.stat(self.mountpoint + path)  # (attributes the invalidation dropped)
                    hold()
                os.listdir(self.mountpoint + path)
                with self._lock:
                    self.listings += 1
            except OSError as exc:
                logger.debug("could not list %s for the lookups in it: %s", path, exc)
            finally:
                if done is not None:
                    done.set()

    def close(self) -> None:
        """Stop the threads after the listings in progress. Not waited for: at the end of a
        session a listing may wait for a reply no worker will send (the kernel fails it when the
        session's device is closed)."""
        with self._lock:
            self._closed = True
            started = len(self._threads)
        for _ in range(started):
            self._queue.put(_STOP)
