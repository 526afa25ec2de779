"""The interface every decompression backend implements, plus the small helpers they share.

A ``CompressedReader`` turns a compressed file into a ``RandomAccessReader`` of its decompressed
bytes: ``pread(offset, size)`` may be called from many threads at once. Seek points (whatever a
backend needs to restart decompression in the middle: gzip windows, bzip2 block offsets, zstd
frames, xz blocks) are written into the SQLite index after the first full pass and loaded again
on every later mount, so that reading the last member never decompresses from the start.

Seek points are stored as rows of ``seek_points(backend, part, data)``: part 0 is a small JSON
header (decompressed size, format version, backend extras), parts 1.. are the backend's payload
cut into pieces of at most ``PART_SIZE`` bytes.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, Iterator, List, Optional, Protocol, Sequence, Tuple, Type, Union

from ..errors import CorruptDataError, RatarmountError, TruncatedArchiveError
from ..formats import FormatId
from ..io.descriptors import check_left, raise_if_exhausted
from ..io.readers import RandomAccessReader
from ..options import CompressionOptions

logger = logging.getLogger(__name__)

#: Bump when the layout of any backend's stored seek points changes (forces an index rebuild).
SEEK_POINTS_VERSION = "1"
#: Largest blob stored in one ``seek_points`` row.
PART_SIZE = 8 * 1024 * 1024


class SeekPointWriter(Protocol):
    """What a reader needs from ``index.sqlite_index.IndexWriter``."""

    def put_seek_points(self, backend: str, parts: Any) -> None: ...


class SeekPointSource(Protocol):
    """What a reader needs from ``index.sqlite_index.IndexReader``."""

    def seek_point_parts(self, backend: str) -> List[bytes]: ...


class PlainFile(Protocol):
    """The compressed file: ``io.readers.PlainFileReader``, a ``FileWindow`` into an outer
    uncompressed archive (``offset`` is where its byte 0 lies in ``fd``), or a ``StreamWindow``
    into an outer compressed one (``fd`` -1: read through ``pread`` only)."""

    fd: int
    size: int
    offset: int

    def pread(self, offset: int, size: int) -> bytes: ...

    def close(self) -> None: ...


#: Zero bytes after gzip data that rapidgzip refuses (fewer it reads past).
GZIP_PADDING_MIN = 5
#: The last two bytes of an empty member's deflate data: a final fixed-Huffman block holding only
#: its end code (zlib), or a final stored block of length 0.
_EMPTY_FINAL_BLOCK_ENDS = (b"\x03\x00", b"\xff\xff")


def trailing_zeros(plain: PlainFile, limit: int = 1 << 20) -> int:
    """How many zero bytes the file ``plain`` ends with (counted up to ``limit``)."""
    size = plain.size
    count = 0
    while count < min(limit, size):
        chunk = plain.pread(max(0, size - count - 65536), min(65536, size - count))
        stripped = chunk.rstrip(b"\0")
        count += len(chunk) - len(stripped)
        if stripped or not chunk:
            break
    return count


def gzip_zero_padded(plain: PlainFile) -> bool:
    """Whether a gzip file ends with zero-byte padding (tape tools pad to their block size;
    gzip(1) ignores it, rapidgzip refuses it). Not when its last member is empty (bgzip's end
    marker, gzip of no data): that member's trailer, the CRC-32 and size of nothing, is eight
    zeros after the end of its only block. A non-empty member's trailer ends in five zeros when
    its size is a multiple of 4 GiB and its CRC's last byte is 0: taken for padding (indexed_gzip
    reads such a file too, only slower)."""
    if trailing_zeros(plain) < GZIP_PADDING_MIN:
        return False
    return not (plain.size >= 10 and plain.pread(plain.size - 10, 2) in _EMPTY_FINAL_BLOCK_ENDS)


@dataclass
class ReaderStats:
    """Counters for diagnostics and tests (approximate under heavy concurrency is fine)."""

    compressed_bytes_read: int = 0
    compressed_reads: int = 0
    decoders_created: int = 0
    frames_decoded: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add_read(self, nbytes: int) -> None:
        with self._lock:
            self.compressed_bytes_read += nbytes
            self.compressed_reads += 1

    def reset(self) -> None:
        with self._lock:
            self.compressed_bytes_read = self.compressed_reads = 0
            self.decoders_created = self.frames_decoded = 0


class FdFile(io.RawIOBase):
    """A read-only file object over a shared descriptor: ``os.pread`` at its own position.

    Every decoder instance gets its own ``FdFile``, so positions never interfere, and all reads
    are counted in ``stats``. It deliberately has no ``fileno()``: libraries then read through
    it instead of duplicating the descriptor behind our back.
    """

    def __init__(self, fd: int, size: int, stats: ReaderStats, start: int = 0, end: Optional[int] = None) -> None:
        super().__init__()
        self._fd = fd
        self._start = start
        self._end = size if end is None else end
        self._pos = start
        self._stats = stats

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        # Straight into the caller's buffer: a decoder reads 1 MiB at a time, and a bytes object
        # per read plus a second copy showed in a zstd archive's index build.
        with memoryview(buffer) as view, view.cast("B") as flat:
            want = min(len(flat), max(0, self._end - self._pos))
            if want <= 0:
                return 0
            n = self._fill(flat[:want])
        self._pos += n
        self._stats.add_read(n)
        return n

    def _fill(self, view: memoryview) -> int:
        """Read into ``view`` at the current position; returns the bytes read."""
        return os.preadv(self._fd, [view], self._pos)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            new = self._start + offset
        elif whence == io.SEEK_CUR:
            new = self._pos + offset
        elif whence == io.SEEK_END:
            new = self._end + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if new < self._start:
            raise OSError(22, "negative seek position")
        self._pos = new
        return new - self._start

    def tell(self) -> int:
        return self._pos - self._start


class StreamFile(FdFile):
    """``FdFile`` over a ``PlainFile`` without a descriptor (a compressed archive inside a
    compressed one): reads go through its ``pread``."""

    def __init__(self, plain: PlainFile, stats: ReaderStats, start: int = 0, end: Optional[int] = None) -> None:
        super().__init__(-1, plain.size, stats, start, end)
        self._plain = plain

    def _fill(self, view: memoryview) -> int:
        data = self._plain.pread(self._pos, len(view))
        view[: len(data)] = data
        return len(data)


def pack_seek_points(header: Dict[str, Any], payload: bytes = b"") -> List[bytes]:
    """Header (as JSON) in part 0, then the payload in pieces."""
    head = json.dumps({"version": SEEK_POINTS_VERSION, **header}, sort_keys=True).encode()
    return [head] + [payload[i : i + PART_SIZE] for i in range(0, len(payload), PART_SIZE)]


def unpack_seek_points(parts: Sequence[bytes]) -> Optional[Tuple[Dict[str, Any], bytes]]:
    """Inverse of ``pack_seek_points``; None when there is nothing (usable) stored."""
    if not parts:
        return None
    try:
        header = json.loads(bytes(parts[0]).decode())
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(header, dict) or header.get("version") != SEEK_POINTS_VERSION:
        return None
    return header, b"".join(bytes(p) for p in parts[1:])


def read_fully(fileobj: Any, size: int) -> bytes:
    """Read ``size`` bytes (fewer only at EOF) from a file object whose reads may come up short.

    One ``read`` usually returns everything (buffered library readers decode straight into the
    new bytes object: no zero-filling, no second copy); short reads are completed in a loop.
    """
    data = fileobj.read(size)
    if data is None or len(data) >= size or not data:
        return data or b""
    pieces = [data]
    done = len(data)
    while done < size:
        more = fileobj.read(size - done)
        if not more:
            break
        pieces.append(more)
        done += len(more)
    return b"".join(pieces)


#: Exceptions backends raise for bad data (in addition to those listed per backend).
_DATA_ERRORS: Tuple[Type[BaseException], ...] = (ValueError, RuntimeError, EOFError, OSError)


@contextlib.contextmanager
def data_errors(path: str, what: str, extra: Tuple[Type[BaseException], ...] = ()) -> Iterator[None]:
    """Turn a library's exception about bad input into ``CorruptDataError`` naming the file."""
    try:
        yield
    except RatarmountError:
        raise
    except (*_DATA_ERRORS, *extra) as exc:
        # A library that cannot open a file says so as an error of the data (rapidgzip: "Opening
        # file '/proc/self/fd/3' with mode 'rb' failed!"): out of descriptors, say that instead,
        # or an intact archive is reported corrupt.
        if isinstance(exc, OSError):
            raise_if_exhausted(exc, path)
        check_left(path)
        text = (str(exc) or type(exc).__name__).strip().splitlines()[0]
        if text == "std::exception":
            text = "corrupt or truncated data"
        elif len(text) > 160:  # some libraries put their whole decoder state into the message
            text = text[:157] + "..."
        raise CorruptDataError(f"{path}: corrupt {what} data ({text})") from exc


class CompressedReader(ABC):
    """Random access to the decompressed bytes of one compressed file.

    Life cycle, as driven by ``sources.archive.open_archive``:

    1. ``head(512)`` sniffs the content (tar or a single file) cheaply.
    2. First mount only: the content is scanned through ``pread`` (sequentially), then
       ``export_seek_points(writer)`` stores what is needed for random access.
    3. Every mount: ``import_seek_points(index)`` loads them (a no-op if this reader built them).
    4. ``pread`` from many threads; ``close``.

    The reader owns the plain file it was given and closes it.
    """

    #: Name of the backend; rows in ``seek_points`` are stored under it.
    backend_name: ClassVar[str] = ""
    #: Human name of the compression (for messages).
    format_name: ClassVar[str] = ""
    format_id: ClassVar[FormatId] = FormatId.UNKNOWN

    def __init__(self, path: str, plain: PlainFile, options: CompressionOptions) -> None:
        self.path = path
        self.options = options
        self.stats = ReaderStats()
        self._plain = plain
        self.compressed_size = plain.size

    # --- reading ------------------------------------------------------------------------------
    @abstractmethod
    def pread(self, offset: int, size: int) -> bytes:
        """Up to ``size`` decompressed bytes at ``offset`` (fewer only at the end). Thread-safe."""

    @property
    @abstractmethod
    def size(self) -> int:
        """Decompressed size. Without imported seek points this may decompress the whole file."""

    def expect_sequential_reads(self) -> None:
        """The caller reads the stream once from start to end (a conversion): advice about
        random access does not apply."""
        return None

    def decode_ahead(self) -> None:  # noqa: B027 - a hint, ignored by default
        """A hint: reads are coming soon (a mount is up). A reader whose cache holds the whole
        decompressed stream may start decoding it in the background; it must return at once."""

    #: Whether ``suggest_member_size`` is worth a look at the first members before a scan.
    wants_member_size: ClassVar[bool] = False

    def count_before_reads(self) -> None:  # noqa: B027 - a hint, ignored by default
        """Count this stream among those that reads compete for in the caches of decoded data
        (``spans.kept_whole``, ``FrameCache.files``) from now on, not only from its first read
        (``MountSource.count_before_reads``: a folder's archives, a union's that show files)."""

    def serves_nested(self) -> None:  # noqa: B027 - a hint, ignored by default
        """A hint, before reads: the stream holds compressed archives (nearly) only, whose own
        decoders read it and keep what they decode; caching it as well would take their room."""

    def suggest_member_size(self, size: int) -> None:
        """Before the first scan: the typical size of the archive's members (a sample of the
        first ones), for backends whose seek points are worth placing by it."""
        return None  # most backends have no use for it

    def head(self, size: int) -> bytes:
        """The first ``size`` decompressed bytes, without building any seek points if possible."""
        return self.pread(0, size)

    def scan_reader(self) -> RandomAccessReader:
        """What the first pass reads (from the start to the end, once), before
        ``export_seek_points``: this reader, or one over a decoder elsewhere."""
        return self

    @contextlib.contextmanager
    def first_pass(self) -> Iterator[RandomAccessReader]:
        """``scan_reader`` for a pass that ends with ``export_seek_points``; when the pass fails,
        ``end_scan`` has its say first (a failing decoder explains a damaged stream best)."""
        reader = self.scan_reader()
        try:
            yield reader
        except RatarmountError:
            self.end_scan()
            raise

    def compressed_progress(self) -> Optional[int]:
        """Compressed bytes read so far, for progress bars of a first pass; None when what has
        been read says little about how far decoding has come."""
        return self.stats.compressed_bytes_read

    def end_scan(self) -> None:
        """End a pass through ``scan_reader`` that stores no seek points (a conversion), or one
        that failed: raise if the stream was not complete and intact, with the decoder's own
        error where it had one (a scan may have tripped over bytes its decoder was about to
        reject)."""
        return None

    # --- seek points ----------------------------------------------------------------------------
    @classmethod
    def index_options_for(cls, options: CompressionOptions) -> Dict[str, str]:
        """Build options recorded in the index; an index built with other values is rebuilt."""
        return {"compression_backend": cls.backend_name, "seek_points_version": SEEK_POINTS_VERSION}

    def index_options(self) -> Dict[str, str]:
        return self.index_options_for(self.options)

    @abstractmethod
    def export_seek_points(self, writer: SeekPointWriter) -> None:
        """Finish the first pass (verifying the whole stream where the format allows it) and store
        the seek points with ``writer.put_seek_points(self.backend_name, parts)``."""

    @abstractmethod
    def import_seek_points(self, index: SeekPointSource) -> None:
        """Load the seek points stored by ``export_seek_points`` (maybe in an earlier process)."""

    def _stored_seek_points(self, index: SeekPointSource) -> Optional[Tuple[Dict[str, Any], bytes]]:
        found = unpack_seek_points(index.seek_point_parts(self.backend_name))
        if found is None:
            logger.warning(
                "%s: the index holds no usable %s seek points; random access will decompress from the start",
                self.path,
                self.backend_name,
            )
        return found

    # --- plumbing -----------------------------------------------------------------------------
    def open_raw(self, start: int = 0, end: Optional[int] = None) -> FdFile:
        """A fresh, independently positioned file object over (a range of) the compressed file."""
        if self._plain.fd < 0:  # a window of a decompressed stream (``io.readers.StreamWindow``)
            return StreamFile(self._plain, self.stats, start, end)
        base = self._plain.offset  # non-zero for a window into an outer archive
        return FdFile(
            self._plain.fd, base + self._plain.size, self.stats, base + start, None if end is None else base + end
        )

    def library_source(self) -> Union[str, FdFile]:
        """What a decoder library should read: a path to the very file we hold open when the
        compressed data is a whole file (the library then reads in C with ``pread``, without
        calling back into Python and taking the GIL for every compressed block), else a
        ``FdFile`` over our window of the descriptor. ``/proc/self/fd/N`` names the open file
        itself, so a file replaced on disk meanwhile cannot be mixed up with ours."""
        fd_path = f"/proc/self/fd/{self._plain.fd}"
        if self._plain.fd >= 0 and self._plain.offset == 0 and os.path.exists(fd_path):
            try:
                if os.stat(fd_path).st_size == self._plain.size:
                    return fd_path
            except OSError:
                pass
        return self.open_raw()

    def raw_pread(self, offset: int, size: int) -> bytes:
        data = self._plain.pread(offset, size)
        self.stats.add_read(len(data))
        return data

    def data_errors(self, extra: Tuple[Type[BaseException], ...] = ()) -> "contextlib.AbstractContextManager[None]":
        return data_errors(self.path, self.format_name, extra)

    def explain_failure(self) -> Optional[str]:
        """Why the first pass may have failed on data other tools accept, and what to do (None:
        nothing to add to the library's message)."""
        return None

    def truncation(self, failure: CorruptDataError) -> Optional[str]:
        """After a first pass failed with ``failure``: how the data is truncated, when there is
        evidence that the file's end, not bad data, stopped the decoder (None: no such evidence;
        the failure stays "corrupt"). Some libraries report both alike."""
        return None

    @contextlib.contextmanager
    def explained_failures(self) -> Iterator[None]:
        """Around a first pass: bad data is reported with ``explain_failure``'s words added,
        and a truncated file as truncated (``truncation``)."""
        try:
            yield
        except CorruptDataError as exc:
            truncated = self.truncation(exc)
            if truncated is not None:
                raise TruncatedArchiveError(f"{self.path}: {self.format_name} data is truncated ({truncated})") from exc
            explained = self.explain_failure()
            if explained is None:
                raise
            raise CorruptDataError(f"{exc}; {explained}") from exc

    def preadinto(self, offset: int, view: memoryview) -> int:
        """``pread`` into a caller's buffer (FUSE reads straight into libfuse's)."""
        data = self.pread(offset, len(view))
        view[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._plain.close()

    def __enter__(self) -> "CompressedReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.path!r}>"
