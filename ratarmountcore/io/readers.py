"""Random-access byte sources and seekable views on them.

Everything that serves file contents is a ``RandomAccessReader``: ``pread(offset, size)`` with no
shared file position, so any number of threads may read at once. A plain file is ``os.pread`` on
one descriptor (the GIL is released during the system call); compressed streams implement the
same protocol on top of their decompressors.
"""

from __future__ import annotations

import bisect
import errno
import io
import os
import stat
import threading
from typing import Callable, List, Optional, Protocol, Sequence, Tuple

from . import forks, holes


class RandomAccessReader(Protocol):
    def pread(self, offset: int, size: int) -> bytes: ...

    def close(self) -> None: ...


#: Linux returns at most this much from one read system call.
MAX_SYSCALL_READ = 0x7FFFF000


def preadinto_fd(fd: int, offset: int, view: memoryview) -> int:
    """Fill ``view`` from ``fd`` at ``offset`` without allocating; returns the bytes read
    (fewer only at end of file)."""
    done = 0
    total = len(view)
    while done < total:
        count = os.preadv(fd, [view[done : done + MAX_SYSCALL_READ]], offset + done)
        if count == 0:
            break
        done += count
    return done


def preadinto(reader: "RandomAccessReader", offset: int, view: memoryview) -> int:
    """``reader.pread`` into a caller's buffer: straight from the file for uncompressed data
    (no allocation, no copy), through ``pread`` otherwise."""
    if isinstance(reader, PlainFileReader):
        return preadinto_fd(reader.fd, offset, view[: max(0, min(len(view), reader.size - offset))])
    if isinstance(reader, FileWindow):
        length = max(0, min(len(view), reader.size - offset))
        return preadinto_fd(reader.fd, reader.offset + offset, view[:length])
    into = getattr(reader, "preadinto", None)  # compressed readers copy from their caches
    if into is not None:
        return int(into(offset, view))
    data = reader.pread(offset, len(view))
    view[: len(data)] = data
    return len(data)


def will_need(reader: "RandomAccessReader", offset: int, size: int) -> None:
    """Tell the kernel that ``size`` bytes at ``offset`` of an uncompressed ``reader`` will be
    read soon, so that it starts reading them from disk now (``POSIX_FADV_WILLNEED``; returns
    at once). Compressed readers and platforms without ``posix_fadvise`` ignore it."""
    if isinstance(reader, PlainFileReader):
        fd, size = reader.fd, min(size, reader.size - offset)
    elif isinstance(reader, FileWindow):
        fd, offset, size = reader.fd, reader.offset + offset, min(size, reader.size - offset)
    else:
        return
    advise = getattr(os, "posix_fadvise", None)
    if advise is None or size <= 0 or fd < 0:
        return
    try:
        advise(fd, offset, size, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass  # a hint only (e.g. a file system without readahead)


class PlainFileReader:
    """``pread`` on a file descriptor."""

    #: Where this reader's byte 0 lies in the file behind ``fd`` (see ``FileWindow``).
    offset = 0

    def __init__(self, path: str) -> None:
        self.path = path
        # O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer, so that
        # the caller can refuse it (reads of regular files block whatever the flag says; it is
        # cleared for them all the same).
        self.fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | os.O_NONBLOCK)
        st = os.fstat(self.fd)
        if stat.S_ISREG(st.st_mode):
            os.set_blocking(self.fd, True)
        self.size = st.st_size

    @classmethod
    def from_fd(cls, path: str, fd: int) -> "PlainFileReader":
        """A reader that owns ``fd`` (opened by the caller; made blocking here)."""
        reader = cls.__new__(cls)
        os.set_blocking(fd, True)
        reader.path, reader.fd, reader.size = path, fd, os.fstat(fd).st_size
        return reader

    def duplicate(self) -> "PlainFileReader":
        """A reader of its own over the same open file (``os.dup``): for a forked child, which
        must not close what its parent's objects hold."""
        return PlainFileReader.from_fd(self.path, os.dup(self.fd))

    def pread(self, offset: int, size: int) -> bytes:
        if size <= MAX_SYSCALL_READ:
            return os.pread(self.fd, size, offset)
        buffer = bytearray(size)
        return bytes(buffer[: preadinto_fd(self.fd, offset, memoryview(buffer))])

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class FileWindow:
    """``size`` bytes at ``offset`` of a file descriptor owned by someone else: a member of an
    uncompressed archive seen as a file of its own (e.g. a .tar.gz inside a .tar)."""

    def __init__(self, fd: int, offset: int, size: int, path: str = "") -> None:
        self.fd = fd
        self.offset = offset
        self.size = size
        self.path = path

    def pread(self, offset: int, size: int) -> bytes:
        if offset >= self.size:
            return b""
        size = min(size, self.size - offset)
        if size <= MAX_SYSCALL_READ:
            return os.pread(self.fd, size, self.offset + offset)
        buffer = bytearray(size)
        return bytes(buffer[: preadinto_fd(self.fd, self.offset + offset, memoryview(buffer))])

    def close(self) -> None:
        """The descriptor belongs to the outer archive."""


#: What a small read of a ``StreamWindow`` asks of the stream: a decoder reads its compressed
#: input in small pieces in order (zlib through ``DeflateResumer``: 32 KiB), and each piece
#: that went on past what the stream's span cache held made it decode the span from its seek
#: point again.
WINDOW_AHEAD = 256 * 1024
#: Each thread's last window of any ``StreamWindow`` (one per thread: with one per stream, 100
#: inner archives held 50 MiB of them).
_WINDOWS = threading.local()


class StreamWindow:
    """``size`` bytes at ``offset`` of a decompressed stream: a compressed archive inside a
    compressed one (a .tar.bz2 in a .tar.zst) seen as a file of its own. It has no descriptor
    (``fd`` is -1), so its decoders read it through Python (``compression.base.StreamFile``).
    ``reader`` must be thread-safe (a compressed reader is; its first pass's stream is not, which
    is why a first pass reads a copy instead: ``tar/spool.py``)."""

    fd = -1

    def __init__(self, reader: RandomAccessReader, offset: int, size: int, path: str = "") -> None:
        self.reader = reader
        #: Where byte 0 lies in ``reader``'s stream (not in a file: ``offset`` stays 0 for the
        #: ``PlainFile`` protocol, whose offsets are into ``fd``).
        self.start = offset
        self.offset = 0
        self.size = size
        self.path = path

    def pread(self, offset: int, size: int) -> bytes:
        if offset >= self.size or size <= 0:
            return b""
        size = min(size, self.size - offset)
        if size >= WINDOW_AHEAD:
            return self.reader.pread(self.start + offset, size)
        owner, begin, window = getattr(_WINDOWS, "last", (None, 0, b""))
        if owner is not self or not (begin <= offset and offset + size <= begin + len(window)):
            window = self.reader.pread(self.start + offset, min(WINDOW_AHEAD, self.size - offset))
            begin = offset
            _WINDOWS.last = (self, begin, window)
        return window[offset - begin : offset - begin + size]

    def close(self) -> None:
        pass  # the stream belongs to the reader it came from


class ReaderStream(io.RawIOBase):
    """A seekable file object over a ``RandomAccessReader`` for scanning.

    Reads go through a read-ahead window of ``read_ahead`` bytes: headers of small members that
    lie close together cost one ``pread`` per window, while a seek over a large member's data
    reads nothing of it (a ``BufferedReader`` would refill its whole buffer on every seek and so
    read the entire archive).
    """

    def __init__(self, reader: RandomAccessReader, size: Optional[int] = None, read_ahead: int = 16 * 1024) -> None:
        super().__init__()
        self._reader = reader
        self._size = size
        self._pos = 0
        self._read_ahead = read_ahead
        self._window = b""
        self._window_start = 0
        #: The window before this one (see ``pread``).
        self._previous = b""
        self._previous_start = 0

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = max(0, self._total_size() - self._pos)
        start = self._pos - self._window_start
        head = b""
        if 0 <= start < len(self._window):
            if start + size <= len(self._window):
                data = self._window[start : start + size]
                self._pos += len(data)
                return data
            # Straddles the window's end: keep its tail and continue from there, so the reader
            # sees forward reads that never overlap (a streaming decoder would otherwise have to
            # restart from the start of its frame for the overlap).
            head = self._window[start:]
            self._pos += len(head)
            size -= len(head)
            if len(self._window) < self._read_ahead:
                return head  # the window ended at the end of the data
        if size >= self._read_ahead:
            data = self._reader.pread(self._pos, size)
        else:
            self._previous, self._previous_start = self._window, self._window_start
            self._window = self._reader.pread(self._pos, self._read_ahead)
            self._window_start = self._pos
            data = self._window[:size]
        self._pos += len(data)
        return head + data if head else data

    def pread(self, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset``, from the read-ahead windows (this one and the one
        before) as far as they hold them, the rest from the reader; the position stays.

        For the first bytes of a member and for the scan of an inner tar: they follow the header
        just read, so they are in a window or go on from its end. A compressed reader's first
        pass decodes forward, and a ``pread`` behind where it stands decoded the frame again
        from its start: the first open of a 68 MB .tar.xz of 200 class tars (24 MiB blocks)
        with ``-r`` took 5.5 s instead of 1.9 s, a 340 MB .tar.gz of 1,000 3.5 s instead of
        2.1 s."""
        pieces: List[bytes] = []
        # (The previous window too: a read that ran past the window's end replaced it, and the
        # header that read ended in may be followed by data that the previous window holds.)
        for window, window_start in ((self._previous, self._previous_start), (self._window, self._window_start)):
            start = offset - window_start
            if 0 <= start < len(window):
                piece = window[start : start + size]
                if len(piece) == size and not pieces:
                    return piece
                pieces.append(piece)
                offset += len(piece)
                size -= len(piece)
                if not size or len(window) < self._read_ahead:
                    return b"".join(pieces)  # (a window shorter than asked for ended at the end)
        pieces.append(self._reader.pread(offset, size))
        return b"".join(pieces)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def,override]
        data = self._reader.pread(self._pos, len(buffer))
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            self._pos = offset
        elif whence == io.SEEK_CUR:
            self._pos += offset
        else:
            self._pos = self._total_size() + offset
        return self._pos

    def _total_size(self) -> int:
        """The size given, else the reader's ``size`` (a compressed reader may have to decompress
        to the end to know it, so it is only asked when needed)."""
        if self._size is None:
            size = getattr(self._reader, "size", None)
            if size is None:
                raise io.UnsupportedOperation("size unknown")
            self._size = int(size() if callable(size) else size)
        return self._size

    def tell(self) -> int:
        return self._pos


Extent = Tuple[int, int]  # (offset in the member file, length); stored back to back in the archive
#: ``whence`` values that find data and holes (``os.SEEK_DATA``, ``os.SEEK_HOLE`` on Linux).
_SEEK_HOLES = tuple(getattr(os, name) for name in ("SEEK_DATA", "SEEK_HOLE") if hasattr(os, name))


class MemberFile(io.RawIOBase):
    """Seekable, read-only view of one member: ``size`` bytes at ``data_offset`` of ``reader``,
    or, for sparse members, the listed extents with zeros in the holes (``seek`` with
    ``os.SEEK_DATA``/``os.SEEK_HOLE`` finds them; other members are data to their end).

    Each handle has its own position; the underlying reader is shared and thread-safe.
    """

    def __init__(
        self,
        reader: RandomAccessReader,
        data_offset: int,
        size: int,
        sparse: Optional[Sequence[Extent]] = None,
        name: str = "",
        guard: Optional[Callable[[], None]] = None,
        renew: Optional[Callable[[], Tuple[RandomAccessReader, Optional[Callable[[], None]]]]] = None,
        on_close: Optional[Callable[[], None]] = None,
        current_size: Optional[Callable[[], int]] = None,
    ) -> None:
        """``renew``: in a forked child, the reader and guard of that process (``io/forks.py``);
        without it, a handle opened before a fork fails with EIO after it. ``on_close``: called
        once when the handle is closed (a reader of its own to close). ``current_size``: for a
        file of the host, which may grow or shrink while open (a log): its size now, asked for
        when a read reaches past the size known (``tail -f`` through the mount)."""
        super().__init__()
        self._on_close = on_close
        self._current_size = current_size
        self._reader = reader
        self._generation = forks.generation
        self._renew = renew
        #: Called before every read; raises when the data may no longer be read (see
        #: ``sources/watch.py``).
        self._guard = guard
        self._offset = data_offset
        self._size = size
        self._pos = 0
        self.name = name
        self._lock = threading.Lock()
        #: Whether the member is sparse: its data is the extents, with zeros between them -- all
        #: zeros when it has none (a map of no extents; reading from ``data_offset`` would serve
        #: the next member's bytes).
        self._sparse = sparse is not None
        if sparse is not None:
            self._starts = [start for start, _ in sparse]
            self._extents = list(sparse)
            stored = []
            total = 0
            for _, length in sparse:
                stored.append(total)
                total += length
            self._stored = stored
        else:
            self._extents = []

    def close(self) -> None:
        on_close, self._on_close = self._on_close, None
        try:
            super().close()
        finally:
            if on_close is not None:
                on_close()

    def _after_fork(self) -> None:
        """Opened before a fork, used after it: take this process's reader (the parent's waits
        for threads that are not here) and a lock of its own."""
        if self._renew is None:
            raise OSError(errno.EIO, f"{self.name or 'member'}: opened before a fork; open it again after it")
        self._reader, self._guard = self._renew()
        self._lock = threading.Lock()
        self._generation = forks.generation

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file")  # (what a regular file says)

    @property
    def size(self) -> int:
        return self._size

    def readable(self) -> bool:
        self._check_open()
        return True

    def seekable(self) -> bool:
        self._check_open()
        return True

    def pread(self, offset: int, size: int) -> bytes:
        """Read without touching the handle's position (used by FUSE)."""
        if self._generation != forks.generation:
            self._after_fork()
        if self._current_size is not None and offset + size > self._size:
            self._size = self._current_size()
        if offset >= self._size or size <= 0:
            return b""
        if self._guard is not None:
            self._guard()
        size = min(size, self._size - offset)
        if not self._sparse:
            data = self._reader.pread(self._offset + offset, size)
            if len(data) != size and self._current_size is None:
                raise OSError(f"short read from archive at offset {self._offset + offset}")
            return data
        return self._pread_sparse(offset, size)

    def preadinto(self, offset: int, view: memoryview) -> int:
        """Like ``pread`` into ``view`` (used by FUSE to fill libfuse's buffer directly)."""
        if self._generation != forks.generation:
            self._after_fork()
        if self._current_size is not None and offset + len(view) > self._size:
            self._size = self._current_size()
        if offset >= self._size or not len(view):
            return 0
        if self._guard is not None:
            self._guard()
        size = min(len(view), self._size - offset)
        if self._sparse:
            data = self._pread_sparse(offset, size)
            view[:size] = data
            return size
        count = preadinto(self._reader, self._offset + offset, view[:size])
        if count != size and self._current_size is None:  # (a host file may have shrunk)
            raise OSError(f"short read from archive at offset {self._offset + offset}")
        return count

    def _pread_sparse(self, offset: int, size: int) -> bytes:
        out = bytearray(size)  # zeros for holes
        end = offset + size
        i = max(0, bisect.bisect_right(self._starts, offset) - 1)
        while i < len(self._extents):
            start, length = self._extents[i]
            if start >= end:
                break
            lo, hi = max(start, offset), min(start + length, end)
            if lo < hi:
                data = self._reader.pread(self._offset + self._stored[i] + (lo - start), hi - lo)
                if len(data) != hi - lo:
                    raise OSError("short read from archive in sparse member")
                out[lo - offset : hi - offset] = data
            i += 1
        return bytes(out)

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def,override]
        self._check_open()
        # Straight into the caller's buffer: no intermediate bytes, and large reads from a
        # compressed archive skip the span cache as they do through the mount.
        if self._generation != forks.generation:
            self._after_fork()
        with self._lock:
            view = memoryview(buffer).cast("B")
            grows = self._current_size is not None
            count = self.preadinto(self._pos, view) if self._pos < self._size or grows else 0
            self._pos += count
            return count

    def readall(self) -> bytes:
        self._check_open()
        if self._generation != forks.generation:
            self._after_fork()
        with self._lock:
            if self._current_size is not None:
                self._size = self._current_size()
            data = self.pread(self._pos, self._size - self._pos)
            self._pos += len(data)
            return data

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._check_open()
        if self._generation != forks.generation:
            self._after_fork()
        with self._lock:
            if whence == io.SEEK_SET:
                new = offset
            elif whence == io.SEEK_CUR:
                new = self._pos + offset
            elif whence == io.SEEK_END:
                new = self._size + offset
            elif whence in _SEEK_HOLES:  # (OSError ENXIO past the data, as lseek(2))
                new = holes.seek_data(self._size, self._extents if self._sparse else None, offset, whence)
            else:
                raise ValueError(f"invalid whence {whence}")
            if new < 0:
                raise OSError(22, "negative seek position")
            self._pos = new
            return new

    def tell(self) -> int:
        self._check_open()
        return self._pos
