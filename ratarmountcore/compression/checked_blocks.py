"""Blocks of decompressed data already checked against their checksums, kept for small reads.

A small read of a .tar.gz is widened to the 16 KiB block(s) it touches, which are checked against
the stored block checksums (``block_crcs.py``) before anything is served. A sequential reader of
small files reads each block several times in a row (one member after the other), a random
reader the one or two blocks its member lies in; keeping the last blocks checked saves decoding
and checking them again.

They used to be kept per reader, 8 each: a folder of 100 .tar.gz mounted with ``-r`` kept 12.5
MiB of them after 1,000 random reads, a folder of 1,000 would keep 125 MiB, and only the blocks
that readers are in at the moment are ever read again. So all readers of the process share one
LRU, bounded in blocks: enough for every thread that serves reads to be in a block of its own
several times over.
"""

from __future__ import annotations

import collections
import itertools
import threading
from typing import Optional, Tuple

from ..io import forks

#: Checked blocks kept in all, for all readers of the process (16 KiB each: 512 KiB; one reader
#: alone kept 8 before, 128 KiB).
PROCESS_BLOCKS = 32

_tokens = itertools.count(1)


def new_token() -> int:
    """A key for one reader's blocks, never reused in the process (unlike ``id()``)."""
    return next(_tokens)


class CheckedBlocks:
    """Process-wide LRU of checked blocks, keyed by (reader token, block start)."""

    def __init__(self, capacity: int = PROCESS_BLOCKS) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._blocks: "collections.OrderedDict[Tuple[int, int], bytes]" = collections.OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, token: int, start: int) -> Optional[bytes]:
        key = (token, start)
        with self._lock:
            data = self._blocks.get(key)
            if data is None:
                self.misses += 1
            else:
                self._blocks.move_to_end(key)
                self.hits += 1
            return data

    def put(self, token: int, start: int, data: bytes) -> None:
        key = (token, start)
        with self._lock:
            self._blocks[key] = data
            self._blocks.move_to_end(key)
            while len(self._blocks) > self.capacity:
                self._blocks.popitem(last=False)

    def drop(self, token: int) -> None:
        """Forget the blocks of a reader that closes."""
        with self._lock:
            for key in [key for key in self._blocks if key[0] == token]:
                del self._blocks[key]

    def __len__(self) -> int:
        return len(self._blocks)


BLOCKS = CheckedBlocks()


def _new_in_child() -> None:
    global BLOCKS
    BLOCKS = CheckedBlocks(BLOCKS.capacity)  # (a thread of the parent may have held the lock)


forks.in_child(_new_in_child)
