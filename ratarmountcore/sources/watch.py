"""Whether an archive still holds what its index describes, while it is mounted.

Reads of an uncompressed tar are plain ``pread`` calls at the offsets the index recorded. If the
archive is rewritten in place while mounted (``tar -cf`` to the same name truncates and reuses
the file), those offsets point into the new content and would return wrong bytes without any
error (compressed archives fail their checksums instead, with a less telling message). So a file
open (and a read, for the low-level front-end without OPEN messages) first asks the archive's
``ArchiveWatch``, which looks at the file's size and modification time at most once per
``CHECK_INTERVAL`` (one ``fstat``; cheap on a parallel file system too):

- unchanged: nothing to do;
- same size, new modification time (``touch``, a copy that kept the bytes): the blocks sampled for
  the fingerprint when it was opened are read again; the same bytes mean the same archive;
- larger (``tar -r``, ``cat more.gz >> a.gz``): the sampled blocks before the old end's last
  ``APPEND_TAIL`` bytes (where tar overwrites its end-of-archive blocks) must be unchanged; the old
  members are still where the index says, the new ones show after mounting again (an archive too
  small to have such blocks counts as changed). For an uncompressed tar the bound is where its
  members end (``data_end``, from the index), and that holds at the same size too: a member
  appended into the padding of the last 10 KiB record leaves the size as it was (such an append
  failed every file with EIO; found in session 25);
- anything else (smaller, or a sampled block differs): changed. That is logged once, and every
  later open or read of the archive's files fails with ``ArchiveChangedError`` (EIO) until it is
  mounted again.

Replacing the archive by renaming a new file over it changes nothing for the mount: it keeps
reading the file it opened. Within one interval after a change, reads may still be served; the
kernel's page cache also keeps serving what it read before (the old, consistent content).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, Optional

from ..errors import ArchiveChangedError
from ..formats import tar_header_checksum_ok
from ..index.fingerprint import SAMPLE, ArchiveStats, changed_samples

logger = logging.getLogger(__name__)

#: Seconds between two looks at the archive file.
CHECK_INTERVAL = 1.0
#: Bytes at the old end of a grown archive whose sampled blocks may differ (tar's two end
#: blocks and the padding of its last 10 KiB record are overwritten by appended members).
APPEND_TAIL = 20 * 1024
#: ``ArchiveWatch._changed`` once the watch is closed.
_CLOSED = "closed"


class ArchiveWatch:
    """Tells whether the archive file behind ``fd`` (opened as ``stats`` describe it) still
    holds what it held then."""

    def __init__(self, path: str, fd: int, stats: ArchiveStats, data_end: Optional[Callable[[], int]] = None) -> None:
        """``data_end``: where an uncompressed tar's members end (asked once it changed)."""
        self.path = path
        self._data_end = data_end
        self._fd = fd
        self._stats = stats
        self._size = stats.size
        self._mtime_ns = stats.mtime_ns
        #: The change time as it was when watched first: rewritten in place with the modification
        #: time put back (``rsync --inplace -t``), an archive keeps size and mtime, never it.
        self._ctime_ns = stats.ctime_ns
        self._lock = threading.Lock()
        self._next = time.monotonic() + CHECK_INTERVAL
        self._changed: Optional[str] = None

    def renewed(self, fd: int) -> "ArchiveWatch":
        """The same watch over ``fd`` (a duplicate of this one's), with a lock of its own: for a
        forked child. What it knows (the archive changed, or was appended to) it keeps."""
        watch = ArchiveWatch(self.path, fd, self._stats, self._data_end)
        watch._size, watch._mtime_ns, watch._changed = self._size, self._mtime_ns, self._changed
        watch._ctime_ns = self._ctime_ns
        return watch

    def close(self) -> None:
        """The source over the archive was closed (its descriptor with it): from now on every
        check fails, without looking at a descriptor number that may name another file by now."""
        with self._lock:
            if self._changed is None:
                self._changed = _CLOSED
            self._fd = -1

    def check(self) -> None:
        """Raise ``ArchiveChangedError`` if the archive changed (looks at most once per interval)."""
        if self._changed is None:
            now = time.monotonic()
            if now < self._next:
                return
            with self._lock:
                if self._changed is None and now >= self._next:
                    self._changed = self._compare()
                    self._next = time.monotonic() + CHECK_INTERVAL
                    if self._changed is not None:
                        logger.error(
                            "%s: changed since it was mounted (%s); its files fail with EIO until it is mounted again",
                            self.path, self._changed,
                        )  # fmt: skip
            if self._changed is None:
                return
        if self._changed is _CLOSED:
            raise ArchiveChangedError(f"{self.path}: no longer open (it changed while mounted)")
        raise ArchiveChangedError(f"{self.path}: changed since it was mounted ({self._changed}); mount it again")

    def _compare(self) -> Optional[str]:
        """None when the archive still holds what it held, else why not."""
        try:
            st = os.fstat(self._fd)
        except OSError as exc:
            return f"cannot stat it: {exc.strerror}"
        if st.st_size == self._size and st.st_mtime_ns == self._mtime_ns and st.st_ctime_ns == self._ctime_ns:
            return None
        old = self._stats.size
        if st.st_size < old:
            return f"it shrank from {old} to {st.st_size} bytes"
        try:
            changed = changed_samples(self._fd, self._stats)  # (each sampled block read once)
            if st.st_size == old and not changed:
                logger.info("%s: modification or change time changed since it was mounted; same content", self.path)
                self._size, self._mtime_ns, self._ctime_ns = st.st_size, st.st_mtime_ns, st.st_ctime_ns
                return None
            end = old - APPEND_TAIL
            if self._data_end is not None:
                end = min(old, -(-self._data_end() // 512) * 512)  # (what tar -r leaves as it was)
                if st.st_size == old and not tar_header_checksum_ok(os.pread(self._fd, 512, end)):
                    # (no member appended where the end-of-archive blocks were: an edit)
                    return "its content differs"
            # Unchanged before ``end`` (where tar -r may have written), with a block there to tell.
            before = [offset for offset, _crc in self._stats.samples if offset + SAMPLE <= end]
            same = bool(before) and all(offset + SAMPLE > end for offset in changed)
        except OSError as exc:
            return f"cannot read it: {exc.strerror}"
        except Exception as exc:  # noqa: BLE001 - (the index, asked where the members end)
            return f"cannot tell where its members end: {exc}"
        if not same:
            grown = f", and it grew from {old} to {st.st_size} bytes" if st.st_size != old else ""
            return f"its content differs{grown}"
        if st.st_size != old:
            logger.warning(
                "%s: grew from %d to %d bytes since it was mounted (appended to); what was added shows "
                "once it is mounted again", self.path, old, st.st_size,
            )  # fmt: skip
        else:
            logger.warning(
                "%s: appended to since it was mounted (after its last member, at the same size); what was "
                "added shows once it is mounted again", self.path,
            )  # fmt: skip
        self._size, self._mtime_ns, self._ctime_ns = st.st_size, st.st_mtime_ns, st.st_ctime_ns
        return None
