"""Open member files by handle, shared by both FUSE front-ends.

Thread safety: single-key dict operations (atomic under the GIL); handles come from a counter.
"""

from __future__ import annotations

import errno
import itertools
import os
from typing import Dict

from ratarmountcore.io.readers import MemberFile
from ratarmountcore.sources.base import FileInfo, MountSource


class OpenFiles:
    def __init__(self, source: MountSource) -> None:
        self.source = source
        self._files: Dict[int, MemberFile] = {}
        self._next = itertools.count(1)

    def open(self, info: FileInfo) -> int:
        handle = next(self._next)
        self._files[handle] = self.source.open_info(info)
        return handle

    def read(self, handle: int, offset: int, view: memoryview) -> int:
        member = self._files.get(handle)
        if member is None:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        return member.preadinto(offset, view)

    def read_unopened(self, info: FileInfo, offset: int, view: memoryview) -> int:
        """A read of a file the kernel opened without telling us (zero-message opens)."""
        member = self.source.open_info(info)
        try:
            return member.preadinto(offset, view)
        finally:
            member.close()

    def release(self, handle: int) -> None:
        member = self._files.pop(handle, None)
        if member is not None:
            member.close()

    def clear(self) -> None:
        self._files.clear()
