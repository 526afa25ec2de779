"""Random access for formats made of independently decodable frames (zstd frames, xz blocks).

The frame table -- compressed offset and size, decompressed offset and size of every frame -- is
found cheaply from the file's structure, stored in the index as the seek points, and used to
jump straight to the frame that holds a requested offset.

Thread safety and memory:

* Frames up to ``whole_frame_limit`` bytes (decompressed) are decoded whole, which verifies their
  checksum *before* any byte is returned, and kept in a small LRU cache of at most
  ``cache_bytes`` bytes under one lock. Decoding happens outside the lock (at most ``threads``
  decodes at a time, and one per frame: other threads wanting the same frame wait for it).
* Larger frames cannot be cached. They are read through a bounded pool of streaming cursors
  (``max_cursors``), each positioned somewhere inside one frame; a read continues the cursor
  closest behind it or starts a new one at the frame start. Such files are slow to seek in; a
  warning is logged once per reader. Their checksums are verified once, during the first mount.
"""

from __future__ import annotations

import bisect
import collections
import logging
import struct
import threading
from abc import abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar, Dict, List, Optional, Set

from ..errors import CorruptDataError
from ..options import CompressionOptions
from .base import CompressedReader, PlainFile, SeekPointSource, SeekPointWriter, pack_seek_points

logger = logging.getLogger(__name__)

_ROW = struct.Struct("<qqqqq")


@dataclass
class FrameTable:
    """One row per non-empty frame, in file order. ``aux`` is backend-specific (xz: check id)."""

    comp_offsets: List[int] = field(default_factory=list)
    comp_sizes: List[int] = field(default_factory=list)
    decomp_offsets: List[int] = field(default_factory=list)
    decomp_sizes: List[int] = field(default_factory=list)
    aux: List[int] = field(default_factory=list)

    def append(self, comp_offset: int, comp_size: int, decomp_size: int, aux: int = 0) -> None:
        if decomp_size <= 0:
            return  # empty frames hold nothing to seek to
        self.comp_offsets.append(comp_offset)
        self.comp_sizes.append(comp_size)
        self.decomp_offsets.append(self.size)
        self.decomp_sizes.append(decomp_size)
        self.aux.append(aux)

    @property
    def size(self) -> int:
        return self.decomp_offsets[-1] + self.decomp_sizes[-1] if self.decomp_offsets else 0

    def __len__(self) -> int:
        return len(self.comp_offsets)

    def find(self, offset: int) -> int:
        """Index of the frame holding decompressed ``offset`` (which must be < size)."""
        return bisect.bisect_right(self.decomp_offsets, offset) - 1

    def pack(self) -> bytes:
        rows = zip(self.comp_offsets, self.comp_sizes, self.decomp_offsets, self.decomp_sizes, self.aux)
        return b"".join(_ROW.pack(*row) for row in rows)

    @classmethod
    def unpack(cls, payload: bytes) -> "FrameTable":
        table = cls()
        for comp_offset, comp_size, _decomp_offset, decomp_size, aux in _ROW.iter_unpack(payload):
            table.append(comp_offset, comp_size, decomp_size, aux)
        return table


class FrameStream:
    """Sequential decoder of one large frame: ``read(n)`` returns up to n bytes (fewer only at
    the frame end) and raises if the frame's checksum or size turns out wrong at its end."""

    def read(self, size: int) -> bytes:
        raise NotImplementedError

    def close(self) -> None:
        pass


@dataclass
class _Cursor:
    frame: int
    position: int  # inside the frame
    stream: FrameStream


class FramedReader(CompressedReader):
    whole_frame_limit: ClassVar[int] = 32 * 1024 * 1024
    cache_bytes: ClassVar[int] = 64 * 1024 * 1024
    max_cursors: ClassVar[int] = 4
    #: How to get a file with more frames (for the warning about slow seeking).
    multi_frame_hint: ClassVar[str] = ""

    def __init__(self, path: str, plain: PlainFile, options: CompressionOptions) -> None:
        super().__init__(path, plain, options)
        self._table_lock = threading.Lock()
        self._frames: Optional[FrameTable] = None
        self._warned = False
        # whole-frame cache
        self._cache_lock = threading.Lock()
        self._cache: "collections.OrderedDict[int, bytes]" = collections.OrderedDict()
        self._cached_bytes = 0
        self._inflight: Dict[int, threading.Event] = {}
        self._decode_slots = threading.BoundedSemaphore(max(1, options.threads()))
        # streaming cursors for large frames
        self._cursor_cond = threading.Condition()
        self._idle_cursors: List[_Cursor] = []
        self._live_cursors = 0
        self._verified: Set[int] = set()
        self._closed = False

    # --- backend hooks ------------------------------------------------------------------------
    @abstractmethod
    def _build_table(self) -> FrameTable:
        """Find the frames from the file's structure (cheap: headers only where possible)."""

    @abstractmethod
    def _decode_frame(self, frame: int, table: FrameTable) -> bytes:
        """Decode one frame whole, verifying its checksum and size."""

    @abstractmethod
    def _open_stream(self, frame: int, table: FrameTable) -> FrameStream:
        """A streaming decoder positioned at the start of one frame."""

    # --- frame table --------------------------------------------------------------------------
    @property
    def frames(self) -> FrameTable:
        table = self._frames
        if table is None:
            with self._table_lock:
                if self._frames is None:
                    with self.data_errors():
                        self._set_table(self._build_table())
                table = self._frames
        assert table is not None
        return table

    def _set_table(self, table: FrameTable) -> None:
        self._frames = table
        largest = max(table.decomp_sizes, default=0)
        if largest > self.whole_frame_limit and not self._warned:
            self._warned = True
            logger.warning(
                "%s has %d %s frame(s), the largest holds %.0f MiB: random access has to decompress "
                "from a frame start and will be slow. %s",
                self.path,
                len(table),
                self.format_name,
                largest / 2**20,
                self.multi_frame_hint,
            )

    @property
    def size(self) -> int:
        return self.frames.size

    def export_seek_points(self, writer: SeekPointWriter) -> None:
        table = self.frames
        self._verify_large_frames(table)
        writer.put_seek_points(self.backend_name, self.seek_point_blobs(table, self.compressed_size))

    @classmethod
    def seek_point_blobs(cls, table: FrameTable, compressed_size: int) -> List[bytes]:
        """What ``export_seek_points`` stores (also used by the converter, which knows the table)."""
        header = {"size": table.size, "compressed_size": compressed_size, "frames": len(table)}
        return pack_seek_points(header, table.pack())

    def import_seek_points(self, index: SeekPointSource) -> None:
        if self._frames is not None:
            return  # built (and exported) by this reader
        found = self._stored_seek_points(index)
        if found is None:
            return
        with self._table_lock:
            self._set_table(FrameTable.unpack(found[1]))

    # --- reading ------------------------------------------------------------------------------
    def pread(self, offset: int, size: int) -> bytes:
        table = self.frames
        end = min(offset + size, table.size)
        if size <= 0 or offset < 0 or offset >= end:
            return b""
        pieces: List[bytes] = []
        frame = table.find(offset)
        position = offset
        while position < end:
            start = table.decomp_offsets[frame]
            length = table.decomp_sizes[frame]
            lo = position - start
            hi = min(end - start, length)
            if length <= self.whole_frame_limit:
                data = self._cached_frame(frame, table)
                pieces.append(data[lo:hi] if (lo, hi) != (0, length) else data)
            else:
                pieces.append(self._stream_read(frame, lo, hi - lo, table))
            position = start + hi
            frame += 1
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _cached_frame(self, frame: int, table: FrameTable) -> bytes:
        while True:
            with self._cache_lock:
                data = self._cache.get(frame)
                if data is not None:
                    self._cache.move_to_end(frame)
                    return data
                event = self._inflight.get(frame)
                if event is None:
                    event = self._inflight[frame] = threading.Event()
                    break
            event.wait()  # another thread decodes it; on its failure we try ourselves
        try:
            with self._decode_slots:
                with self.data_errors():
                    data = self._decode_frame(frame, table)
            self.stats.frames_decoded += 1
            if len(data) != table.decomp_sizes[frame]:
                raise CorruptDataError(
                    f"{self.path}: {self.format_name} frame at byte {table.comp_offsets[frame]} decompressed to "
                    f"{len(data)} bytes instead of {table.decomp_sizes[frame]}"
                )
            self._verified.add(frame)
            with self._cache_lock:
                self._cache[frame] = data
                self._cached_bytes += len(data)
                while self._cached_bytes > self.cache_bytes and len(self._cache) > 1:
                    _, old = self._cache.popitem(last=False)
                    self._cached_bytes -= len(old)
            return data
        finally:
            with self._cache_lock:
                self._inflight.pop(frame, None)
            event.set()

    # --- large frames -------------------------------------------------------------------------
    def _take_cursor(self, frame: int, position: int, table: FrameTable) -> _Cursor:
        with self._cursor_cond:
            while True:
                if self._closed:
                    raise ValueError("I/O operation on a closed compressed file")
                usable = [c for c in self._idle_cursors if c.frame == frame and c.position <= position]
                if usable:
                    cursor = max(usable, key=lambda c: c.position)
                    self._idle_cursors.remove(cursor)
                    return cursor
                if self._live_cursors < self.max_cursors:
                    self._live_cursors += 1
                    break
                if self._idle_cursors:  # recycle the least recently used one
                    old = self._idle_cursors.pop(0)
                    old.stream.close()
                    break
                self._cursor_cond.wait()
        try:
            with self.data_errors():
                stream = self._open_stream(frame, table)
        except BaseException:
            with self._cursor_cond:
                self._live_cursors -= 1
                self._cursor_cond.notify()
            raise
        return _Cursor(frame, 0, stream)

    def _give_back_cursor(self, cursor: _Cursor, ok: bool) -> None:
        with self._cursor_cond:
            keep = ok and not self._closed and cursor.position < self._frames_size(cursor.frame)
            if keep:
                self._idle_cursors.append(cursor)
            else:
                self._live_cursors -= 1
            self._cursor_cond.notify()
        if not keep:
            cursor.stream.close()

    def _frames_size(self, frame: int) -> int:
        table = self._frames
        return table.decomp_sizes[frame] if table is not None else 0

    def _stream_read(self, frame: int, position: int, size: int, table: FrameTable) -> bytes:
        cursor = self._take_cursor(frame, position, table)
        ok = False
        try:
            with self.data_errors():
                while cursor.position < position:  # skip forward, in bounded steps
                    skipped = cursor.stream.read(min(position - cursor.position, 1 << 20))
                    if not skipped:
                        break
                    cursor.position += len(skipped)
                data = self._stream_exact(cursor, size) if cursor.position == position else b""
            if len(data) != size:
                raise CorruptDataError(
                    f"{self.path}: {self.format_name} frame at byte {table.comp_offsets[frame]} ends early"
                )
            ok = True
            return data
        finally:
            self._give_back_cursor(cursor, ok)

    def _stream_exact(self, cursor: _Cursor, size: int) -> bytes:
        pieces = []
        remaining = size
        while remaining > 0:
            data = cursor.stream.read(remaining)
            if not data:
                break
            pieces.append(data)
            remaining -= len(data)
            cursor.position += len(data)
        if cursor.position == self._frames_size(cursor.frame):
            if cursor.stream.read(1):  # reading past the end verifies the checksum
                raise CorruptDataError(f"{self.path}: {self.format_name} frame {cursor.frame} is longer than indexed")
            self._verified.add(cursor.frame)
        return b"".join(pieces)

    def _verify_large_frames(self, table: FrameTable) -> None:
        """Decode every large frame to its end once (the scan usually got close already), so that
        a corrupt file fails the first mount instead of serving unverified bytes later."""
        for frame, length in enumerate(table.decomp_sizes):
            if length <= self.whole_frame_limit or frame in self._verified:
                continue
            with self._cursor_cond:
                ahead = [c.position for c in self._idle_cursors if c.frame == frame]
            start = max(ahead, default=0)
            position = start
            while position < length:
                step = min(length - position, 4 << 20)
                self._stream_read(frame, position, step, table)
                position += step

    def close(self) -> None:
        with self._cursor_cond:
            self._closed = True
            idle, self._idle_cursors = self._idle_cursors, []
            self._cursor_cond.notify_all()
        for cursor in idle:
            cursor.stream.close()
        with self._cache_lock:
            self._cache.clear()
            self._cached_bytes = 0
        super().close()
