"""Feed a tar stream's members into an index writer, optionally descending into tars inside it.

Recursion (``-r``): a regular member whose first block is a valid tar header is indexed as a
folder holding the inner archive's members. The inner archive is uncompressed, so its members'
data offsets are plain offsets into the outer (decompressed) stream, and reading them is exactly
as cheap as reading any other member; the second mount needs no rescan because the inner rows are
in the same persistent index.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import stat
from typing import Callable, Optional

from ..errors import ArchiveError
from ..formats import FormatId, sniff_bytes
from ..index.sqlite_index import IndexWriter
from ..io.readers import RandomAccessReader, ReaderStream
from ..progress import Progress
from .scanner import BLOCK, KIND_DIR, KIND_FILE, MemberRecord, TarScanner

logger = logging.getLogger(__name__)

MAX_DEPTH = 8


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


def _as_folder(record: MemberRecord) -> MemberRecord:
    permissions = stat.S_IMODE(record.mode)
    permissions |= (permissions & 0o444) >> 2  # searchable where readable
    return dataclasses.replace(record, kind=KIND_DIR, mode=stat.S_IFDIR | permissions, size=0)


def index_tar(
    reader: RandomAccessReader,
    size: Optional[int],
    writer: IndexWriter,
    label: str,
    progress: bool,
    recursive: bool,
) -> None:
    bar = Progress(f"Indexing {label}", size, enabled=progress)
    count = [0]

    def on_progress(position: int) -> None:
        bar.update(position, count[0])

    try:
        _scan(reader, size, writer, label, on_progress, count, recursive, "", 0, 0)
    finally:
        bar.close()


def _scan(
    reader: RandomAccessReader,
    size: Optional[int],
    writer: IndexWriter,
    label: str,
    on_progress: Callable[[int], None],
    count: list,  # type: ignore[type-arg]
    recursive: bool,
    prefix: str,
    base: int,
    depth: int,
) -> None:
    stream = io.BufferedReader(ReaderStream(reader, size), buffer_size=1 << 20)  # type: ignore[arg-type]
    for record in TarScanner(stream, label, on_progress if depth == 0 else None):  # type: ignore[arg-type]
        if prefix:
            record.path = prefix + record.path if record.path != "/" else prefix
            if record.path == prefix:
                continue  # the inner archive's own "./" entry: the folder is the member itself
        record.offset_header += base
        record.offset_data += base
        inner = None
        if recursive and depth < MAX_DEPTH and record.kind == KIND_FILE and record.sparse is None:
            inner = _inner_tar(reader, record, base)
        if inner is None:
            writer.add(record)
            count[0] += 1
            continue
        writer.add(_as_folder(record))
        count[0] += 1
        try:
            _scan(
                inner,
                record.size,
                writer,
                label,
                on_progress,
                count,
                recursive,
                record.path,
                record.offset_data,
                depth + 1,
            )
        except ArchiveError as exc:
            # Rows already added stay (they are correct); the rest of the inner archive is lost.
            logger.warning("%s: inner archive %s is damaged (%s); showing what could be read", label, record.path, exc)


def _inner_tar(reader: RandomAccessReader, record: MemberRecord, base: int) -> Optional[WindowReader]:
    """A reader over the member's data if it is an uncompressed tar archive, else None."""
    if record.size < 2 * BLOCK:
        return None
    relative = record.offset_data - base
    head = reader.pread(relative, BLOCK)
    if head == b"\0" * BLOCK or sniff_bytes(head) != FormatId.TAR:
        return None
    return WindowReader(reader, relative, record.size)
