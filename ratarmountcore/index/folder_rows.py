"""Rows of recently used folders, kept for lookups.

Lookups often come in runs within one folder: a stat of every file of a tree, a loader opening
the images of one class in turn. A lookup in a folder that one of the last two lookups also
went to loads the folder's rows with one query (folders of up to ``max_entries`` entries), and
every further lookup there is a dictionary hit instead of an SQLite round trip. Other lookups are
one indexed query for one row: random opens all over the tree (a shuffling data loader) would
otherwise load a whole folder -- several pages from disk when the cache is cold -- for the one
or two files wanted from it (1,000 random reads, cold cache: ~370 folder loads). Two, not one:
opening ``d/f`` looks up ``d`` in its parent, then ``f`` in ``d``, so a walk over the files of
``d`` alternates between two folders. The cache is bounded by the total number of rows it keeps
(least recently used folders go first).

Runs are counted over the lookups of the whole process, not of one archive: in a folder of
archives (ImageNet's 1,000 class tars mounted with ``-r``) each archive has a single folder, so two
lookups in one archive were always "a run" however many lookups in other archives came between
them, and a random open's second visit to a class loaded all its rows for one file (1,000 random
reads: ~370 folder loads, 0.1 s of the daemon's CPU). A lookup continues a run only when at most
``RUN_GAP`` lookups anywhere came between it and its archive's previous one (a few DataLoader
workers walking one folder interleave that closely).

The index is immutable while it is open, so cached rows never go stale.
"""

from __future__ import annotations

import collections
import itertools
import threading
from typing import Callable, Dict, Hashable, List, Optional

from .sqlite_index import Row

#: How many of the last distinct folders looked up count as "recent" (see the module docstring).
RECENT_FOLDERS = 2
#: How many lookups of the process may come between two in one archive's folder of a run.
RUN_GAP = 32
#: Ticks of the process's lookups (``next`` on a count is atomic).
_TICKS = itertools.count()


class RecentFolders:
    """The last ``RECENT_FOLDERS`` distinct folders looked up in: ``again(folder)`` tells whether
    a lookup there continues a run (and remembers the folder otherwise). Callers serialize."""

    def __init__(self) -> None:
        self._recent: List[Hashable] = []

    def again(self, folder: Hashable) -> bool:
        recent = self._recent
        if folder in recent:
            return True
        recent.append(folder)
        if len(recent) > RECENT_FOLDERS:
            del recent[0]
        return False


#: Marks a folder too large to cache (or not worth it).
_TOO_LARGE: Dict[bytes, Row] = {}


class FolderRows:
    def __init__(self, load: Callable[[bytes, int], List[Row]], max_rows: int = 16384, max_entries: int = 4096) -> None:
        """``load(parent, limit)`` returns at most ``limit`` rows of the folder in (name, id) order."""
        self._load = load
        self.max_rows = max_rows
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._folders: "collections.OrderedDict[bytes, Dict[bytes, Row]]" = collections.OrderedDict()
        self._rows = 0
        #: Another lookup in one of the folders of the last lookups loads it.
        self._recent = RecentFolders()
        self._last_tick = -RUN_GAP - 1
        self.loads = 0

    def rows(self, parent: bytes) -> Optional[Dict[bytes, Row]]:
        """name -> newest row of the folder ``parent``, or None (then look the name up directly)."""
        tick = next(_TICKS)
        with self._lock:
            rows = self._folders.get(parent)
            if rows is not None:
                self._folders.move_to_end(parent)
                self._last_tick = tick
                return rows if rows is not _TOO_LARGE else None
            close = tick - self._last_tick <= RUN_GAP
            self._last_tick = tick
            if not self._recent.again(parent) or not close:
                return None
        loaded = self._load(parent, self.max_entries + 1)
        self.loads += 1
        if len(loaded) > self.max_entries:
            found = _TOO_LARGE
        else:
            found = {row[2]: row for row in loaded}  # (name, id) order: the newest row wins
        with self._lock:
            if parent not in self._folders:
                self._folders[parent] = found
                self._rows += len(found)
                while self._rows > self.max_rows and len(self._folders) > 1:
                    _, old = self._folders.popitem(last=False)
                    self._rows -= len(old)
        return found if found is not _TOO_LARGE else None
