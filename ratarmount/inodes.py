"""Node ids for the libfuse low-level API.

The kernel names files by node ids that we hand out in LOOKUP and READDIRPLUS replies; it counts
how often it has been given each id and returns the count in FORGET once it drops the inode. The
table maps ids to paths of the ``MountSource`` and frees an id when its count reaches zero, so its
size follows the kernel's inode cache, not the size of the archive. The root is id 1 for ever.
"""

from __future__ import annotations

import errno
import threading
from typing import Dict, Iterable, List, Sequence

ROOT_ID = 1


class StaleNodeError(OSError):
    """A node id the kernel should no longer use (it was forgotten)."""

    def __init__(self, node: int) -> None:
        super().__init__(errno.ESTALE, f"unknown node id {node}")


class InodeTable:
    def __init__(self, first: int = ROOT_ID + 1) -> None:
        """Ids are handed out from ``first`` on (above the inode numbers of a source that names
        its entries itself, see ``MountSource.by_ino``)."""
        self._lock = threading.Lock()
        #: id -> [path, lookup count]
        self._nodes: Dict[int, List[object]] = {ROOT_ID: ["/", 1]}
        self._ids: Dict[str, int] = {"/": ROOT_ID}
        self.first = first
        self._next = first

    def __len__(self) -> int:
        return len(self._nodes)

    def path(self, node: int) -> str:
        entry = self._nodes.get(node)
        if entry is None:
            raise StaleNodeError(node)
        return entry[0]  # type: ignore[return-value]

    def remember(self, path: str) -> int:
        """The id of ``path``, counting one more reference held by the kernel."""
        with self._lock:
            return self._remember(path)

    def remember_all(self, paths: Iterable[str]) -> List[int]:
        with self._lock:
            return [self._remember(path) for path in paths]

    def _remember(self, path: str) -> int:
        node = self._ids.get(path)
        if node is None:
            node = self._next
            self._next += 1
            self._ids[path] = node
            self._nodes[node] = [path, 1]
        else:
            self._nodes[node][1] += 1  # type: ignore[operator]
        return node

    def forget(self, node: int, count: int) -> None:
        with self._lock:
            self._forget(node, count)

    def forget_all(self, nodes: Sequence[int], counts: Sequence[int]) -> None:
        """``forget`` for pairs of ``nodes`` and ``counts`` (a FORGET_MULTI batch). Ids below
        ``first`` are not the table's (a stable source's inode numbers): skipped in bulk."""
        first = self.first
        pairs = [(node, count) for node, count in zip(nodes, counts) if node >= first]
        if pairs:
            with self._lock:
                for node, count in pairs:
                    self._forget(node, count)

    def _forget(self, node: int, count: int) -> None:
        if node == ROOT_ID:
            return
        entry = self._nodes.get(node)
        if entry is None:
            return
        left = entry[1] - count  # type: ignore[operator]
        if left > 0:
            entry[1] = left
        else:
            del self._nodes[node]
            del self._ids[entry[0]]  # type: ignore[arg-type]
