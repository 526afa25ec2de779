"""Open member files by handle, shared by both FUSE front-ends.

Thread safety: single-key dict operations (atomic under the GIL); handles come from a counter.
"""

from __future__ import annotations

import errno
import itertools
import os
import threading
from typing import Any, Dict, List, Optional

from ratarmountcore.io.readers import MemberFile
from ratarmountcore.sources.base import FileInfo, MountSource


class OpenFiles:
    def __init__(self, source: MountSource) -> None:
        self.source = source
        self._files: Dict[int, MemberFile] = {}
        #: handle -> the node it was opened through (when given)
        self._nodes: Dict[int, int] = {}
        #: node -> [the entry it was opened from, open handles]
        self._opened: Dict[int, List[Any]] = {}
        self._lock = threading.Lock()
        self._next = itertools.count(1)

    def open(self, info: FileInfo, node: int = 0) -> int:
        """A handle of the file ``info``; ``node``: the kernel's node it is opened through, whose
        entry as opened ``opened_info`` then tells while a handle is open."""
        handle = next(self._next)
        self._files[handle] = self.source.open_info(info)
        if node:
            with self._lock:
                self._nodes[handle] = node
                held = self._opened.setdefault(node, [info, 0])
                held[0] = info
                held[1] += 1
        return handle

    def opened_info(self, node: int) -> Optional[FileInfo]:
        """The entry a node was last opened from, while a handle of it is open (the attributes
        of a file replaced or removed since, for the processes that still read it)."""
        held = self._opened.get(node)
        return None if held is None else held[0]  # type: ignore[no-any-return]

    def read(self, handle: int, offset: int, view: memoryview) -> int:
        member = self._files.get(handle)
        if member is None:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        return member.preadinto(offset, view)

    def read_unopened(self, info: FileInfo, offset: int, view: memoryview) -> int:
        """A read of a file the kernel opened without telling us (zero-message opens)."""
        return self.source.read_into(info, offset, view)

    def release(self, handle: int) -> None:
        node = self._nodes.pop(handle, 0)
        if node:
            with self._lock:
                held = self._opened.get(node)
                if held is not None:
                    held[1] -= 1
                    if held[1] <= 0:
                        del self._opened[node]
        member = self._files.pop(handle, None)
        if member is not None:
            member.close()

    def clear(self) -> None:
        self._files.clear()
        self._nodes.clear()
        self._opened.clear()
