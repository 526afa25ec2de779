"""The listing of a folder too large to hold at once, made ``CHUNK`` entries at a time.

A listing is answered from records made when the folder is opened (READDIRPLUS records, each
with its attributes). For a folder of 200,000 files that held ~100 MiB in the daemon (the rows
and the records) while the kernel read it, and a flat folder of millions would hold gigabytes.
Folders with more than ``CHUNK`` entries are listed from the source a part at a time instead
(``MountSource.list_stat_rows_after``: the rows after the last name served, in name order); only
the part the kernel is reading is kept. The kernel reads a listing in order, so each part is
made once; an offset before the current part (a ``seekdir`` back, a second reader of the same
shared listing) starts again from the first part.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Generic, List, Optional, Sequence, Tuple, TypeVar

#: Entries made at a time (~0.8 MiB of records).
CHUNK = 4096

T = TypeVar("T", bound=Tuple[Any, ...])


class PagedListing(Generic[T]):
    """``head`` (".", "..") and then the entries ``fetch(after, index)`` makes: at most ``chunk``
    entries, whose names sort after the name ``after`` (None: from the first), the first of them
    at position ``index`` of the listing. An entry's first item is its name (bytes)."""

    def __init__(
        self,
        head: Sequence[T],
        fetch: Callable[[Optional[bytes], int], List[T]],
        first: Optional[List[T]] = None,
        chunk: int = CHUNK,
    ) -> None:
        self._head = list(head)
        self._fetch = fetch
        self._chunk_size = chunk
        self._lock = threading.Lock()
        self._start = len(self._head)
        self._chunk: List[T] = first if first is not None else fetch(None, self._start)

    def entries_from(self, offset: int) -> List[T]:
        """The entries from position ``offset`` to the end of the part holding it ([] after the
        last entry)."""
        with self._lock:
            if offset < len(self._head):
                if self._start != len(self._head):
                    self._start, self._chunk = len(self._head), self._fetch(None, len(self._head))
                return self._head[offset:] + self._chunk
            if offset < self._start:  # back: from the first part again
                self._start, self._chunk = len(self._head), self._fetch(None, len(self._head))
            while offset >= self._start + len(self._chunk) and len(self._chunk) >= self._chunk_size:
                start = self._start + len(self._chunk)
                after = self._chunk[-1][0]
                self._chunk = self._fetch(after, start)
                self._start = start
            return self._chunk[offset - self._start :]
