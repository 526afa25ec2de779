"""Folders listed ahead of a walk that looks up every file, folder after folder.

A run of lookups in a folder (folder_prefetch.py) costs that folder two LOOKUP round trips and
a wait for its listing before the kernel answers the rest. Measured with the kernel's FUSE
tracepoints on the 100,000-file tar, a stat of every file after a ``find`` spent 2.6 of its
3.2 s in those waits, one folder after the other, while a core sat idle. A walk (``os.walk``,
``find``, ``ls -lR``, a file list in tree order) goes through a folder's subfolders in the
order they are listed. So once a run begins in the folder that follows the one the walk was in
before, the next ``DEPTH`` folders are handed to the prefetcher too, and a lookup that comes in
one of them keeps the window ``DEPTH`` folders ahead of it.

A lookup in a folder whose listing is queued, or not yet made, waits for it; its name is then
listed without a node id (the kernel holds it as being looked up, and would wait for our
answer to link it). A lookup that comes once the listing's records were made must not wait:
the kernel may be about to link that name. This module only decides: it reads the names of a
parent's entries to find the next folders, and the caller reads each folder's rows (they make
the listing) and asks the prefetcher.
"""

from __future__ import annotations

import bisect
import stat
import threading
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

from ratarmountcore.sources.base import NameRow

#: Folders listed ahead of the walk.
DEPTH = 3
#: Siblings read at once from the parent folder, to find the next ones.
SIBLINGS_CHUNK = 256
#: Folders handed over and not looked up in, kept before the listed ones among them are dropped.
PENDING_MAX = 32
#: Folders remembered as read ahead (then forgotten all at once).
REMEMBERED = 4096

#: ``list_names_after(parent, after, limit)``: the (name, mode, ino) rows after name ``after``.
NamesAfter = Callable[[str, bytes, int], Optional[Sequence[NameRow]]]


class Pending:
    """A folder handed to the prefetcher ahead of the walk, until a lookup comes there."""

    __slots__ = ("path", "end", "done", "built", "names", "arrived")

    def __init__(self, path: str) -> None:
        self.path = path
        #: The offset of the listing's last entry, once its rows were read.
        self.end = 1 << 62
        #: Set once the kernel linked the folder's listing (see ``linked``), or by the
        #: prefetcher once it listed the folder or failed to.
        self.done = threading.Event()
        #: Whether the listing's records were made: a lookup may no longer wait.
        self.built = False
        #: Names whose lookups wait for the listing: listed without a node id.
        self.names: FrozenSet[bytes] = frozenset()
        #: Set by the first lookup there (a listing held back for it may go on).
        self.arrived = threading.Event()


def _split(path: str) -> Tuple[str, bytes]:
    above, _, name = path.rpartition("/")
    return above or "/", name.encode("utf-8", "surrogateescape")


class FolderReadAhead:
    """Which folders to list ahead of a walk, and the lookups waiting for them."""

    def __init__(self, names_after: NamesAfter, depth: int = DEPTH) -> None:
        self._names_after = names_after
        self._depth = depth
        self._lock = threading.Lock()
        #: Whether a listing waits for the walk now (one at a time: see ``hold``).
        self._holding = False
        #: By node id: the folders handed over and not looked up in yet.
        self.pending: Dict[int, Pending] = {}
        #: Node ids of the folders read ahead already (never twice while remembered).
        self._started: Dict[int, None] = {}
        #: The folder a walk that keeps going looks up next (a run there is not a random one).
        self._expected = ""
        #: Part of the last parent's entries, in listing order: (name, ino, mode).
        self._siblings: Tuple[str, List[Tuple[bytes, int, int]]] = ("", [])

    def after_run(self, path: str) -> List[Tuple[str, int]]:
        """A run of lookups began in folder ``path``: the folders to list ahead of it, by path
        and node id (none unless the walk came to it from the folder before it)."""
        expected = self._expected
        self._expected = ""
        if path == "/":
            return []
        folders = self._next(path)
        if path != expected:  # (a first run, or a random one: where the walk would go next)
            self._expected = folders[0][0] if folders else ""
            return []
        return self._window(folders)

    def after_hit(self, path: str) -> List[Tuple[str, int]]:
        """A lookup came in folder ``path``, listed ahead: the next folders to list."""
        return self._window(self._next(path))

    def _window(self, folders: List[Tuple[str, int]]) -> List[Tuple[str, int]]:
        window = folders[: self._depth]
        self._expected = folders[self._depth][0] if len(folders) > self._depth else ""
        started = self._started
        if len(started) > REMEMBERED:
            started.clear()
        chosen = [(path, node) for path, node in window if node not in started]
        for _path, node in chosen:
            started[node] = None
        return chosen

    def _next(self, path: str) -> List[Tuple[str, int]]:
        """The folders listed after ``path`` in its parent, at most ``depth`` + 1."""
        above, name = _split(path)
        cached_above, rows = self._siblings
        if cached_above == above and rows and rows[0][0] <= name < rows[-1][0]:
            start = bisect.bisect_right(rows, (name, 1 << 64, 0))
        else:
            found = self._names_after(above, name, SIBLINGS_CHUNK)
            if not found:
                return []
            rows = [(raw, ino, mode) for raw, mode, ino in found]
            self._siblings = (above, rows)
            start = 0
        prefix = "/" if above == "/" else above + "/"
        folders = []
        for raw, ino, mode in rows[start:]:
            if stat.S_ISDIR(mode):
                folders.append((prefix + raw.decode("utf-8", "surrogateescape"), ino))
                if len(folders) > self._depth:
                    break
        return folders

    def add(self, node: int, path: str) -> Pending:
        """Folder ``node`` at ``path`` is handed to the prefetcher."""
        pending = Pending(path)
        with self._lock:
            if len(self.pending) >= PENDING_MAX:  # (listed before the walk came: none looked up)
                self.pending = {key: old for key, old in self.pending.items() if not old.done.is_set()}
            self.pending[node] = pending
        return pending

    def drop(self, node: int) -> None:
        with self._lock:
            self.pending.pop(node, None)

    def join(self, node: int, name: bytes) -> Optional[Pending]:
        """A lookup of ``name`` in folder ``node``: the folder's pending listing, if it has one
        not finished yet, with ``name`` among the names it lists without a node id when the
        lookup may still wait for it (``built`` false)."""
        with self._lock:
            pending = self.pending.pop(node, None)
            if pending is None:
                return None
            if pending.done.is_set():  # listed long ago: a lookup that is no longer the walk's
                return None
            if not pending.built:
                pending.names = pending.names | {name}
                self.pending[node] = pending  # (for the listing to see the name: dropped after)
                pending.arrived.set()
            return pending

    def hold(self, pending: Pending, seconds: float) -> None:
        """Called by the prefetcher's thread before it lists ``pending``'s folder: wait up to
        ``seconds`` for the walk's first lookup there, unless another listing waits already.

        Made before the walk comes to the folder, the listing would race with it: a lookup
        there while the kernel links the listing's entries must be answered at once (the
        kernel may be waiting for it to link that name), and the walk's next name is then
        looked up before the kernel links it, and the next: the walk and the linking go in
        step, a round trip per file (18 lookups in one folder of 60, seen through a mount).
        So one listing at a time waits for the walk, the first handed over: the folder the
        walk comes to next. The listings after it go ahead (the walk finds them linked)."""
        with self._lock:
            if self._holding or pending.built or pending.names:
                return
            self._holding = True
        try:
            pending.arrived.wait(seconds)
        finally:
            with self._lock:
                self._holding = False

    def linked(self, node: int, offset: int) -> None:
        """The kernel asks for folder ``node``'s listing from entry ``offset`` on: it linked
        every entry before it. Once that is all of them, the lookups waiting for the listing
        are answered at once, not after the page that ends it went back and the prefetcher's
        thread woke up (a round trip and two thread wake-ups, for every folder of a walk)."""
        pending = self.pending.get(node)
        if pending is not None and pending.built and offset >= pending.end:
            pending.done.set()

    def claim(self, node: int) -> FrozenSet[bytes]:
        """The listing of folder ``node`` for the prefetcher is being made: the names it must
        list without a node id. No lookup waits for it from now on."""
        with self._lock:
            pending = self.pending.get(node)
            if pending is None:
                return frozenset()
            pending.built = True
            return pending.names
