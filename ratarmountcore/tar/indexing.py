"""Feed a tar stream's members into an index writer, optionally descending into archives inside it.

Recursion (``-r``): a regular member that is itself a tar archive is indexed as a folder holding
the inner archive's members, in the same persistent index, so the second mount needs no rescan.

- An **uncompressed** inner tar needs nothing new: its members' data offsets are plain offsets into
  the outer (decompressed) stream and are read like any other member.
- A **compressed** inner tar (``class.tar.gz`` inside ``train.tar``) gets a decompressor over its
  bytes in the outer file. Its members' rows carry ``source`` = the folder's row id and offsets
  into that decompressed stream; the decompressor's seek points are stored under
  ``<backend>@<row id>``. Inside a compressed stream (a ``.tar.bz2`` in a ``.tar.zst``, at any
  depth) its bytes exist only decoded: the first pass indexes a temporary copy
  (``tar/spool.py``), and reads go through the outer stream (``io.readers.StreamWindow``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import stat
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from ..compression import expected
from ..errors import ArchiveChangedError, ArchiveError, CorruptDataError, RatarmountError
from ..formats import COMPRESSIONS, FormatId, is_tar_stream, sniff_bytes, stripped_tar_name
from ..index.sqlite_index import IndexWriter
from ..io.readers import FileWindow, RandomAccessReader, ReaderStream
from ..options import CompressionOptions
from ..progress import Progress
from .scanner import BLOCK, KIND_DIR, KIND_FILE, KIND_HARDLINK, MemberRecord, TarScanner
from .spool import Spool

if TYPE_CHECKING:
    from ..compression.base import CompressedReader

logger = logging.getLogger(__name__)

MAX_DEPTH = 8
#: The smallest member worth sniffing: an empty gzip file is 20 bytes.
MIN_ARCHIVE_SIZE = 18


class WindowReader:
    """``size`` bytes of ``reader`` starting at ``offset``, as a reader of its own."""

    def __init__(self, reader: RandomAccessReader, offset: int, size: int) -> None:
        self._reader = reader
        self._offset = offset
        self.size = size

    def pread(self, offset: int, size: int) -> bytes:
        if offset >= self.size:
            return b""
        return self._reader.pread(self._offset + offset, min(size, self.size - offset))

    def close(self) -> None:
        pass


class NamespacedSeekPoints:
    """Stores and finds a nested archive's seek points under ``<backend>@<row id>``."""

    def __init__(self, target: Any, row_id: int) -> None:
        self._target = target
        self._suffix = f"@{row_id}"

    def put_seek_points(self, backend: str, parts: Any) -> None:
        self._target.put_seek_points(backend + self._suffix, parts)

    def seek_point_parts(self, backend: str) -> List[bytes]:
        return self._target.seek_point_parts(backend + self._suffix)  # type: ignore[no-any-return]


def open_nested_compressed(
    fd: int,
    offset: int,
    size: int,
    fmt: FormatId,
    label: str,
    options: CompressionOptions,
    backend: Optional[str] = None,
) -> "CompressedReader":
    from ..compression.registry import open_compressed

    return open_compressed(label, FileWindow(fd, offset, size, label), fmt, options, backend)


@dataclass
class _Context:
    writer: IndexWriter
    label: str
    on_progress: Callable[[int], None]
    recursive: bool
    compression: CompressionOptions
    #: Descriptor of the outer file while the chain of archives is uncompressed, else None.
    fd: Optional[int]
    count: int = 0
    nested: List[str] = field(default_factory=list)
    #: Members shown as folders because they are archives (-r).
    archives: int = 0
    #: Name the folder of an inner ``NAME.tar`` ``NAME`` (``OpenOptions.strip_tar_extension``).
    strip: bool = False
    #: Compressed and decompressed bytes of the compressed inner archives, by format
    #: (``compression/expected.py``).
    decoded: Dict[str, Tuple[int, int]] = field(default_factory=dict)
    #: Where the top-level member being descended into starts: the progress of inner scans and
    #: copies (a compressed top-level stream's bar shows its compressed bytes read instead).
    position: int = 0

    def inner_progress(self, _position: int = 0) -> None:
        self.on_progress(self.position)


def _as_folder(record: MemberRecord, strip: bool = False) -> MemberRecord:
    permissions = stat.S_IMODE(record.mode)
    permissions |= (permissions & 0o444) >> 2  # searchable where readable
    path = stripped_tar_name(record.path) if strip else record.path
    return dataclasses.replace(record, path=path, kind=KIND_DIR, mode=stat.S_IFDIR | permissions, size=0)


def index_tar(
    reader: RandomAccessReader,
    size: Optional[int],
    writer: IndexWriter,
    label: str,
    progress: bool,
    recursive: bool,
    compression: Optional[CompressionOptions] = None,
    fd: Optional[int] = None,
    compressed: Optional[Tuple[int, Callable[[], Optional[int]]]] = None,
    strip_tar_extension: bool = False,
) -> None:
    """Index the tar archive ``reader``; ``fd`` is the descriptor of the file when ``reader`` is
    that file uncompressed (needed to descend into compressed archives inside it).
    ``compressed``: the compressed size and how much of it has been read (None: unknown), for
    the progress bar of a decompressed stream (whose own size is unknown until its end).
    ``strip_tar_extension``: with ``recursive``, an inner ``NAME.tar`` is the folder ``NAME``."""
    bar = Progress(f"Indexing {label}", size, enabled=progress)
    read = None
    if compressed is not None and bar.enabled and compressed[1]() is not None:  # counting starts here
        bar.total, read = compressed

    def report(position: int) -> None:
        bar.update((read() or 0) if read is not None else position, ctx.count)

    ctx = _Context(writer, label, report, recursive, compression or CompressionOptions(), fd)
    ctx.strip = strip_tar_extension
    try:
        _scan(ctx, reader, size, prefix="", base=0, depth=0, source=0)
    finally:
        bar.close()
    if recursive:  # an index without any is the same as one built without -r (check_options)
        writer.set_metadata("inner_archives", str(ctx.archives))
    if ctx.decoded:
        writer.set_metadata(expected.METADATA_KEY, expected.format_sizes(ctx.decoded))


def _scan(
    ctx: _Context, reader: RandomAccessReader, size: Optional[int], prefix: str, base: int, depth: int, source: int
) -> None:
    """Scan one (possibly inner) archive. ``base`` is the offset of ``reader``'s byte 0 in the
    stream that ``source`` names (0: the top-level stream)."""
    # Uncompressed bytes on disk: read little around each header and skip data for free.
    # Decompressed streams must be produced in order anyway: read them in large pieces.
    plain = ctx.fd is not None and source == 0
    stream = ReaderStream(reader, size, read_ahead=16 * 1024 if plain else 1024 * 1024)
    # What a member's first bytes and an inner tar are read from. A decompressed stream's are
    # in (or go on from) the window that the header was read from, and reads behind where its
    # decoder stands may decode a frame again from its start: read through the window.
    near: RandomAccessReader = reader if plain else stream
    progress = ctx.on_progress if depth == 0 else ctx.inner_progress  # (a long inner scan moves the bar too)
    add = ctx.writer.add
    descend = ctx.recursive and depth < MAX_DEPTH
    # An inner tar is a window of the outer stream: a member running past the window's end is
    # not taken (its reads would go on into the outer archive's next bytes).
    for record in TarScanner(stream, ctx.label, progress, end=size if prefix else None):  # type: ignore[arg-type]
        if prefix:
            record.path = prefix + record.path if record.path != "/" else prefix
            if record.path == prefix:
                continue  # the inner archive's own "./" entry: the folder is the member itself
            if record.kind == KIND_HARDLINK:  # its target is a path of the inner archive too
                record.linkname = prefix + record.linkname if record.linkname != "/" else prefix
        if base:
            record.offset_header += base
            record.offset_data += base
        if not (descend and record.kind == KIND_FILE and record.sparse is None and record.size >= MIN_ARCHIVE_SIZE):
            add(record, source)
            ctx.count += 1
            continue
        if not depth:
            ctx.position = record.offset_data
        head = near.pread(record.offset_data - base, min(BLOCK, record.size))
        fmt = sniff_bytes(head)
        if fmt is FormatId.TAR and record.size >= 2 * BLOCK and head != b"\0" * BLOCK:
            folder = _as_folder(record, ctx.strip)
            folder_id = ctx.writer.add_archive_folder(folder, source, file=record)
            ctx.count += 1
            ctx.archives += 1
            inner = WindowReader(near, record.offset_data - base, record.size)
            scan = functools.partial(_scan, ctx, inner, record.size, folder.path, record.offset_data, depth + 1, source)
            _descend(ctx, record, scan, folder_id, source)
            ctx.writer.end_archive_folder(folder_id)
        elif fmt in COMPRESSIONS:
            _index_compressed_member(ctx, record, fmt, depth, source, near, base)
        else:
            ctx.writer.add(record, source)
            ctx.count += 1


def _descend(ctx: _Context, record: MemberRecord, scan: Callable[[], None], folder_id: int, source: int) -> None:
    """Scan the inner archive ``record`` shown as the folder of row ``folder_id``."""
    try:
        scan()
    except ArchiveError as exc:
        if ctx.writer.next_id > folder_id + 1:
            # Rows already added stay (they are correct); the rest of the inner archive is lost.
            logger.warning(
                "%s: inner archive %s is damaged (%s); showing what could be read", ctx.label, record.path, exc
            )
            return
        # Nothing could be read: an empty folder would hide the bytes that are there.
        logger.warning(
            "%s: inner archive %s is damaged (%s); nothing in it could be read, shown as a file",
            ctx.label,
            record.path,
            exc,
        )
        _as_file(ctx, record, folder_id, source)


def _as_file(ctx: _Context, record: MemberRecord, folder_id: int, source: int) -> None:
    """Show the inner archive ``record`` as the file it is after all: forget its folder (row
    ``folder_id``) and what was found in it."""
    ctx.writer.discard_from(folder_id)
    ctx.archives -= 1
    ctx.writer.add(record, source)


def _descend_compressed(
    ctx: _Context, record: MemberRecord, scan: Callable[[], None], folder_id: int, source: int
) -> None:
    """Scan a compressed inner archive. One whose scan fails in any way is shown as the file it
    is (its stored bytes are right): what was read before the failure was never checked against
    the stream's checksums, which come at its end (a damaged tail of zeros decodes to garbage
    that the tar parser trips over, after members that reach into it were listed)."""
    try:
        scan()
    except ArchiveChangedError:
        raise  # the outer archive, not the inner one
    except (ArchiveError, CorruptDataError) as exc:
        logger.warning("%s: inner archive %s is damaged (%s); shown as a file", ctx.label, record.path, exc)
        _as_file(ctx, record, folder_id, source)


def _index_compressed_member(
    ctx: _Context,
    record: MemberRecord,
    fmt: FormatId,
    depth: int,
    source: int,
    near: RandomAccessReader,
    base: int,
) -> None:
    label = f"{ctx.label}:{record.path}"
    spool: Optional[Spool] = None
    if ctx.fd is not None and source == 0:
        fd, offset = ctx.fd, record.offset_data  # its bytes are in the file as they are
    else:  # inside a compressed stream: copied as the scan reaches it (``tar/spool.py``)
        folder = os.path.dirname(ctx.writer.final_path)
        spool = Spool(near, record.offset_data - base, record.size, folder, label, ctx.inner_progress)
        if not spool.start():
            spool.close()
            _add_as_file(ctx, record, source)
            return
        fd, offset = spool.fd, 0
    try:
        _index_compressed_at(ctx, record, fmt, depth, source, fd, offset, spool)
    finally:
        if spool is not None:
            spool.close()


def _add_as_file(ctx: _Context, record: MemberRecord, source: int) -> None:
    ctx.writer.add(record, source)
    ctx.count += 1


def _open_inner(
    ctx: _Context, record: MemberRecord, fmt: FormatId, fd: int, offset: int
) -> Optional["CompressedReader"]:
    label = f"{ctx.label}:{record.path}"
    try:
        return open_nested_compressed(fd, offset, record.size, fmt, label, ctx.compression)
    except RatarmountError as exc:
        logger.warning("%s: cannot open inner archive (%s); shown as a file", label, exc)
        return None


def _index_compressed_at(
    ctx: _Context,
    record: MemberRecord,
    fmt: FormatId,
    depth: int,
    source: int,
    fd: int,
    offset: int,
    spool: Optional[Spool],
) -> None:
    """Index the compressed member ``record``, whose bytes are at ``offset`` of ``fd`` (all of
    them, or the first piece of a ``spool``), as a folder if it holds a tar."""
    reader = _open_inner(ctx, record, fmt, fd, offset)
    if reader is None:
        _add_as_file(ctx, record, source)
        return
    try:
        try:
            is_tar = is_tar_stream(reader.head(BLOCK), reader.head)
        except (RatarmountError, OSError):
            is_tar = False
        if not is_tar:  # e.g. a .csv.gz: keep the member as it is
            _add_as_file(ctx, record, source)
            return
        if spool is not None and not spool.complete:
            reader.close()  # (it saw a part of the file: sizes and tables are read anew)
            reader = None
            if not spool.finish():
                _add_as_file(ctx, record, source)
                return
            reader = _open_inner(ctx, record, fmt, fd, offset)
            if reader is None:
                _add_as_file(ctx, record, source)
                return
        folder_id = ctx.writer.add_archive_folder(_as_folder(record), source, file=record)
        ctx.archives += 1
        ctx.count += 1
        ctx.writer.add_nested_archive(folder_id, record.offset_data, record.size, fmt.value)
        inner = reader

        def scan() -> None:
            with inner.explained_failures(), inner.first_pass() as scan_reader:  # (the hint, as at the top)
                _scan(ctx, scan_reader, None, record.path, 0, depth + 1, folder_id)
            inner.export_seek_points(NamespacedSeekPoints(ctx.writer, folder_id))
            compressed, decoded = ctx.decoded.get(fmt.value, (0, 0))
            ctx.decoded[fmt.value] = (compressed + record.size, decoded + inner.size)

        _descend_compressed(ctx, record, scan, folder_id, source)
        ctx.writer.end_archive_folder(folder_id)
    finally:
        if reader is not None:
            reader.close()
