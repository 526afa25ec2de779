"""Node ids for the libfuse low-level API.

The kernel names files by node ids that we hand out in LOOKUP and READDIRPLUS replies; it counts
how often it has been given each id and returns the count in FORGET once it drops the inode. The
table maps ids to paths of the ``MountSource`` and frees an id when its count reaches zero, so its
size follows the kernel's inode cache, not the size of the archive. The root is id 1 for ever.

A folder's regular files are named by the host file instead of the path (``identity``, see
``MountSource.host_identity``): a file renamed over another gets an id of
its own, so the kernel keeps the two apart (a process still reading the old one reads its bytes,
not the new file's through a shared page cache), and all names of a hard-linked file share one.
Such an id keeps the file's last path; when that name leads to another file by now, the id is
stale (``ReplacedNodeError``).
"""

from __future__ import annotations

import errno
import threading
from typing import Any, Dict, Hashable, Iterable, List, Optional, Sequence, Tuple

ROOT_ID = 1


class StaleNodeError(OSError):
    """A node id the kernel should no longer use (it was forgotten)."""

    def __init__(self, node: int) -> None:
        super().__init__(errno.ESTALE, f"unknown node id {node}")


class ReplacedNodeError(StaleNodeError):
    """A node id of a host file whose name now leads to another file (or to none)."""


def identity_key(identity: Tuple[int, ...]) -> Hashable:
    """A host identity as the table keeps it: a file's (device, inode, change time) as one int
    (~100 bytes less per file the kernel holds than the tuple)."""
    if len(identity) == 3 and all(0 <= part < 1 << 64 for part in identity):
        return (identity[0] << 128) | (identity[1] << 64) | identity[2]
    return identity


def _is_identity(key: Hashable) -> bool:
    """Whether a table key is a host identity (else a path, or a path and a file type)."""
    return isinstance(key, int) or (isinstance(key, tuple) and not isinstance(key[0], str))


def same_file(key: Hashable, identity: Tuple[int, ...]) -> bool:
    """Whether ``identity`` is the host file a node with ``key`` was made for: a regular file
    by device and inode alone (its change time tells files apart that had the same number one
    after the other, but a file written to or renamed since is still the file the node names),
    an archive shown as a folder by all of its identity."""
    if isinstance(key, int) and len(identity) == 3:
        return key >> 64 == (identity[0] << 64) | identity[1]
    return key == identity_key(identity)


class InodeTable:
    def __init__(self, first: int = ROOT_ID + 1) -> None:
        """Ids are handed out from ``first`` on (above the inode numbers of a source that names
        its entries itself, see ``MountSource.by_ino``)."""
        self._lock = threading.Lock()
        #: id -> [path, lookup count, key (the path, or a host identity's ``identity_key``)]
        self._nodes: Dict[int, List[Any]] = {ROOT_ID: ["/", 1, "/"]}
        self._ids: Dict[Hashable, int] = {"/": ROOT_ID}
        self.first = first
        self._next = first

    def __len__(self) -> int:
        return len(self._nodes)

    def path(self, node: int) -> str:
        entry = self._nodes.get(node)
        if entry is None:
            raise StaleNodeError(node)
        return entry[0]  # type: ignore[no-any-return]

    def kind(self, node: int) -> int:
        """The file type bits a node named by path was made for (0: a folder's)."""
        entry = self._nodes.get(node)
        key = None if entry is None else entry[2]
        return key[1] if isinstance(key, tuple) and isinstance(key[0], str) else 0

    def identity(self, node: int) -> Optional[Hashable]:
        """The ``identity_key`` of a node named by a host file, else None."""
        entry = self._nodes.get(node)
        if entry is None or not _is_identity(entry[2]):
            return None
        return entry[2]  # type: ignore[no-any-return]

    def remember(self, path: str, identity: Optional[Tuple[int, ...]] = None, kind: int = 0) -> int:
        """The id of ``path`` (of the host file ``identity``, when given), counting one more
        reference held by the kernel. ``kind``: the file type bits of an entry named by path, if
        not a folder's: a folder that becomes a link (or a link a folder) is another node, since
        the kernel refuses a node whose type changed (EIO)."""
        with self._lock:
            return self._remember(path, identity, kind)

    def remember_all(self, items: Iterable[Tuple[str, Optional[Tuple[int, ...]], int]]) -> List[int]:
        """``remember`` for (path, identity, kind) triples."""
        with self._lock:
            return [self._remember(path, identity, kind) for path, identity, kind in items]

    def _remember(self, path: str, identity: Optional[Tuple[int, ...]], kind: int = 0) -> int:
        key: Hashable = (path if not kind else (path, kind)) if identity is None else identity_key(identity)
        node = self._ids.get(key)
        if node is None:
            node = self._next
            self._next += 1
            self._ids[key] = node
            self._nodes[node] = [path, 1, key]
        else:
            held = self._nodes[node]
            held[1] += 1
            if identity is not None:
                held[0] = path  # (the name it was found under last)
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
        left = entry[1] - count
        if left > 0:
            entry[1] = left
        else:
            del self._nodes[node]
            del self._ids[entry[2]]
