"""Random access for formats made of independently decodable frames (zstd frames, xz blocks).

The frame table -- compressed offset and size, decompressed offset and size of every frame -- is
found cheaply from the file's structure, stored in the index as the seek points, and used to
jump straight to the frame that holds a requested offset.

Thread safety and memory:

* Frames up to ``whole_frame_limit`` bytes (decompressed) are decoded whole, which verifies their
  checksum *before* any byte is returned, and kept in one process-wide LRU cache (shared by all
  readers, one lock) of the largest ``cache_size`` a reader's options give (``--cache-size``,
  32 MiB by default). Once a reader decodes a frame a second time, the cache grows to hold two
  of its largest frames (reads in name order go back and forth across frame boundaries), or
  the whole file when that is at most ``KEPT_WHOLE_FACTOR`` times the cache.
  Decoding happens outside the lock (at most ``threads`` decodes per reader at a time, and one
  per frame: other threads wanting the same frame wait for it).
* Sequential reads (a read that moves on into the frame after the previous read's) have the following
  ``threads`` frames decoded ahead by background threads (the libraries release the GIL while
  decoding), so the first mount of a multi-frame xz or zstd file decodes on all cores while the
  scanner parses headers. Frames decoded ahead are held outside the LRU until first used, so
  they never evict the frame being read (nor each other); they stop at ``AHEAD_BYTES``.
* Larger frames cannot be cached. They are read through an ``InstancePool`` of streaming cursors
  (at most ``max_cursors`` per reader), each positioned somewhere inside one frame; a read
  continues the cursor closest behind it or restarts one at the frame start. Such files are slow
  to seek in; a warning is logged once per reader. Their checksums are verified once, during the
  first mount (``export_seek_points``).
"""

from __future__ import annotations

import array
import bisect
import collections
import concurrent.futures
import itertools
import logging
import mmap
import struct
import threading
from abc import abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar, Dict, List, Optional, Set, Tuple, Union

from ..errors import ArchiveChangedError, CorruptDataError, InvalidIndexError
from ..io import forks
from ..options import CompressionOptions
from .base import CompressedReader, PlainFile, SeekPointSource, SeekPointWriter, pack_seek_points
from .block_crcs import BLOCK, CrcCollector
from .expected import Competition
from .frame_crcs import FrameCrcs, crcs_of
from .pool import InstancePool, Slot
from .spans import GROWTH

logger = logging.getLogger(__name__)

_ROW = struct.Struct("<qqqqq")
#: A decoded frame: bytes, or an anonymous mapping (whose memory is returned when it is freed).
FrameData = Union[bytes, mmap.mmap]


@dataclass
class FrameTable:
    """One row per non-empty frame, in file order. ``aux`` is backend-specific (xz: check id;
    zstd: 1 for a frame with a content checksum)."""

    comp_offsets: List[int] = field(default_factory=list)
    comp_sizes: List[int] = field(default_factory=list)
    decomp_offsets: List[int] = field(default_factory=list)
    decomp_sizes: List[int] = field(default_factory=list)
    aux: List[int] = field(default_factory=list)
    #: The last frame's size is only an upper bound (its header lacks the size, and decoding it
    #: just to measure it would double the first mount's work); it is settled when a stream
    #: first reaches the frame's end. Tables with an open end are never stored.
    open_end: bool = False

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

    def skip(self, size: int) -> int:
        """Decode and drop up to ``size`` bytes (fewer only at the frame end); how many."""
        return len(self.read(size))

    def close(self) -> None:
        pass


#: Decoded frames kept across all readers of the process.
FRAME_CACHE_BYTES = 32 * 1024 * 1024
#: Frames at least this large make random reads slow enough to tell the user (once per reader).
SLOW_FRAME_BYTES = 16 * 1024 * 1024
#: Frames decoded ahead (held until read) stop at this many bytes; one frame is always allowed.
AHEAD_BYTES = 32 * 1024 * 1024
#: The cache grows to hold at least this many of the largest frame of any open reader.
FRAMES_CACHED_AT_LEAST = 2
#: Reads in a row that continue where the previous one ended before a large frame's stream
#: is decoded ahead by a thread (see ``stream_ahead.py``).
SEQUENTIAL_RUN = 2
#: A read that starts at most this far after the previous one's end still counts as sequential.
SEQUENTIAL_GAP = 1024 * 1024
#: A cursor decoding ahead for a sequential reader is kept for its next read even when an idle
#: cursor sits up to this much closer behind it (see ``InstancePool``'s ``momentum``).
MOMENTUM_NEAR = 64 * 1024
#: Files of at most this many times the cache (decompressed, of frames cached whole; all the
#: open files together) are kept whole once read at random (``FramedReader._kept_whole``), as
#: the span cache keeps its streams (``spans.GROWTH``): a 68 MB .tar.xz of three 24 MiB blocks
#: took 0.33 s for each random read. Reads in larger files that miss the frame cache decode
#: only the blocks up to the end of the read (half a frame on average) instead of the whole
#: frame: the cache holds a small part of them, so whole frames would mostly be decoded for one
#: member and evicted. The first pass records block checksums of every frame it decodes.
KEPT_WHOLE_FACTOR = GROWTH
#: What the cursors of such reads may hold, counted as a frame each (at least one per thread).
PARTIAL_CURSOR_BYTES = FRAME_CACHE_BYTES
#: Frames of at least this many bytes that the first pass reaches before they were decoded
#: ahead are streamed to it rather than decoded whole first.
SCAN_STREAM_MIN = 8 * 1024 * 1024
#: Files whose frames carry no checksums named in a warning each, per process (the rest in one).
UNCHECKED_REPORTED = 3
_unchecked_reported = 0
_unchecked_lock = threading.Lock()


class FrameCache(Competition):
    """Process-wide LRU of decoded frames, keyed by (reader token, frame number)."""

    def __init__(self, budget: int) -> None:
        super().__init__()
        self.budget = budget
        #: The largest cache size a reader's options gave (None: none yet, ``budget`` holds).
        self.given: Optional[int] = None
        #: The decompressed sizes of the open readers' files whose frames are cached whole, by
        #: reader token: what random reads over all of them compete for (``opened``).
        self._files: Dict[int, int] = {}
        self._files_total = 0
        self._frames: "collections.OrderedDict[Tuple[int, int], FrameData]" = collections.OrderedDict()
        self._bytes = 0

    def get(self, key: Tuple[int, int]) -> Optional[FrameData]:
        with self._lock:
            data = self._frames.get(key)
            if data is not None:
                self._frames.move_to_end(key)
            return data

    def put(self, key: Tuple[int, int], data: FrameData) -> None:
        with self._lock:
            old = self._frames.pop(key, None)
            if old is not None:
                self._bytes -= len(old)
            self._frames[key] = data
            self._bytes += len(data)
            while self._bytes > self.budget and len(self._frames) > 1:
                _, evicted = self._frames.popitem(last=False)
                self._bytes -= len(evicted)

    def give(self, size: int) -> None:
        """A reader's ``cache_size``: the budget is the largest given (as the span cache's bound
        is), or what ``reserve`` grew it to."""
        with self._lock:
            if self.given is None:
                self.budget = size  # (the default's place, taken by the first reader)
            self.given = max(self.given or 0, size)
            self.budget = max(self.budget, self.given)

    def reserve(self, budget: int) -> None:
        """Grow the budget to at least ``budget`` bytes (never shrinks)."""
        with self._lock:
            self.budget = max(self.budget, budget)

    def drop(self, token: int) -> None:
        """Forget a closed reader: its frames and its file's size."""
        with self._lock:
            for key in [k for k in self._frames if k[0] == token]:
                self._bytes -= len(self._frames.pop(key))
            self._files_total -= self._files.pop(token, 0)

    def opened(self, token: int, size: int) -> None:
        """The decompressed size of reader ``token``'s file (0: its frames are not cached)."""
        with self._lock:
            self._files_total += size - self._files.get(token, 0)
            self._files[token] = size

    def files(self) -> int:
        """The decompressed sizes of the open readers' files and of the expected ones together
        (at least the parent's, in a forked child)."""
        return self._with_counted(self._files_total)

    def keeps_whole(self, size: int) -> bool:
        """Whether ``size`` decompressed bytes are at most ``KEPT_WHOLE_FACTOR`` times the cache
        size given (never when the cache is off)."""
        return 0 < size <= KEPT_WHOLE_FACTOR * (self.given or 0)

    @property
    def cached_bytes(self) -> int:
        return self._bytes


FRAME_CACHE = FrameCache(FRAME_CACHE_BYTES)


def _new_frame_cache_in_child() -> None:
    global FRAME_CACHE
    parent = FRAME_CACHE
    FRAME_CACHE = FrameCache(FRAME_CACHE_BYTES)  # (its lock may have been held at the fork)
    FRAME_CACHE.inherited = parent.files()  # (the child reads the parent's files: ``Competition``)


forks.in_child(_new_frame_cache_in_child)
_TOKENS = itertools.count(1)


class _Cursor:
    """A streaming decoder somewhere inside one large frame (or none yet)."""

    def __init__(self) -> None:
        self.frame = -1
        self.position = 0  # inside the frame
        self.stream: Optional[FrameStream] = None
        #: Reads in a row that continued (nearly) where the previous one ended.
        self.run = 0
        #: Whether ``stream`` is decoded ahead by a thread.
        self.ahead = False
        #: The last bytes read before ``position`` (at most a block): a checked read widened to
        #: whole blocks starts up to one block before where the previous one stopped.
        self.tail = b""
        #: The first pass: the block checksums of everything decoded from the frame start on.
        self.collector: Optional[CrcCollector] = None

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None
        self.frame = -1
        self.ahead = False
        self.tail = b""
        self.collector = None


def _cursor_pool(count: int) -> InstancePool[_Cursor]:
    """Cursors that only move forward in their frame: spread over it, a sequential reader's
    cursor kept (see ``InstancePool``)."""
    return InstancePool(
        lambda: Slot(_Cursor(), position=-1),
        _Cursor.close,
        count,
        grow_before_rewind=True,
        momentum=lambda cursor: cursor.ahead,
        near=MOMENTUM_NEAR,
    )


class FramedReader(CompressedReader):
    whole_frame_limit: ClassVar[int] = 32 * 1024 * 1024
    max_cursors: ClassVar[int] = 8
    #: How to get a file with more frames (for the warning about slow seeking).
    multi_frame_hint: ClassVar[str] = ""
    #: Typical decoding speed on one core, in MiB/s, for the warning's estimate of a miss (session 36,
    #: this VM: zstd -3 decoded 32 MiB in 0.040 s, xz -6 8 MiB in 0.27 s).
    decode_mib_per_second: ClassVar[float] = 100.0

    def __init__(self, path: str, plain: PlainFile, options: CompressionOptions) -> None:
        super().__init__(path, plain, options)
        FRAME_CACHE.give(options.cache_size)
        self._table_lock = threading.Lock()
        self._frames: Optional[FrameTable] = None
        self._warned = False
        self._token = next(_TOKENS)
        self._inflight_lock = threading.Lock()
        self._inflight: Dict[int, threading.Event] = {}
        self._decode_slots = threading.BoundedSemaphore(max(1, options.threads()))
        self._cursors = _cursor_pool(self.max_cursors)
        #: Cursors of reads that decode small frames only up to their end (see ``_partial``),
        #: made at the first such read, when the frame sizes are known.
        self._partial_cursors: Optional[InstancePool[_Cursor]] = None
        self._verified: Set[int] = set()
        #: Frames read whole that failed their checks: the error, raised again without decoding
        #: (each read of a member in a damaged 12 MB xz block decoded the block again, ~1 s, so
        #: reading all of them through a mount took 1-2 minutes; found by fuzzing).
        self._damaged: Dict[int, str] = {}
        #: The largest frame this reader caches whole (0: none).
        self._largest_cached = 0
        #: Whether the file counts among the files the cache's reads compete for
        #: (``FrameCache.opened``): from its first read on, not from its open (``_count_file``).
        self._counted = False
        #: Frames decoded ahead for a sequential reader (see the module docstring).
        self._ahead: Dict[int, "concurrent.futures.Future[FrameData]"] = {}
        self._ahead_depth = max(1, options.threads()) if options.threads() > 1 else 0
        #: Streams of the next large frame, decoding ahead for a sequential reader until a
        #: cursor restarting in that frame takes them over (see ``_park``); oldest first.
        self._parked: Dict[int, FrameStream] = {}
        self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._last_frame = -2
        #: Block checksums of the frames nothing else checks (``frame_crcs``): stored in the
        #: index (after it is opened), or collected by the first pass (before it is written).
        self._crc_table: Optional[FrameCrcs] = None
        self._collected: Dict[int, "array.array[int]"] = {}

    # --- backend hooks ------------------------------------------------------------------------
    @abstractmethod
    def _build_table(self) -> FrameTable:
        """Find the frames from the file's structure (cheap: headers only where possible)."""

    @abstractmethod
    def _decode_frame(self, frame: int, table: FrameTable) -> FrameData:
        """Decode one frame whole, verifying its checksum and size."""

    @abstractmethod
    def _open_stream(self, frame: int, table: FrameTable) -> FrameStream:
        """A streaming decoder positioned at the start of one frame."""

    def _self_checked(self, frame: int, table: FrameTable) -> bool:
        """Whether the frame carries a checksum of its data that decoding it whole verifies."""
        return False

    def _needs_crcs(self, frame: int, table: FrameTable) -> bool:
        """Frames read without their own check before the bytes are served (see ``frame_crcs``)."""
        return table.decomp_sizes[frame] > self.whole_frame_limit or not self._self_checked(frame, table)

    @classmethod
    def crc_table_name(cls) -> str:
        return f"{cls.backend_name}-crc32c"

    @classmethod
    def index_options_for(cls, options: CompressionOptions) -> Dict[str, str]:
        recorded = super().index_options_for(options)
        # Which frames have block checksums depends on the size read whole: indexes built with
        # another (or without checksums) are rebuilt.
        recorded["frame_checks"] = f"crc32c/{BLOCK}/{cls.whole_frame_limit}"
        return recorded

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
        self._cursors.extent = table.size  # which cursor to rewind depends on where the frames end
        largest = max(table.decomp_sizes, default=0)
        self._largest_cached = largest if largest <= self.whole_frame_limit else 0
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
        elif largest >= SLOW_FRAME_BYTES and not self._warned and not FRAME_CACHE.keeps_whole(table.size):
            # (A file kept whole once read at random, alone, is not slow: each frame is decoded
            # once or twice. The 10,000-file .tar.xz of a 24 MiB block and a 9 MiB one: 1,000
            # random reads 1.2 s.)
            self._warned = True
            logger.warning(
                "%s has %s frames of up to %.0f MiB: each random read that misses the cache decodes "
                "its frame from the start (up to all of it, about %.2g s on one core), so random "
                "access will be slow. %s",
                self.path,
                self.format_name,
                largest / 2**20,
                largest / 2**20 / self.decode_mib_per_second,
                self.multi_frame_hint,
            )

    def expect_sequential_reads(self) -> None:
        self._warned = True  # the warnings about slow random access would only confuse

    def seed_frame(self, frame: int, data: FrameData) -> None:
        """Put a frame the backend decoded and verified whole while building the table into
        the cache, so that the first read of it does not decode it again."""
        self._verified.add(frame)
        FRAME_CACHE.put((self._token, frame), data)

    @property
    def size(self) -> int:
        table = self.frames
        if table.open_end:
            with self.data_errors():
                self._verify_large_frames(table)  # decodes the last frame to its end
        return table.size

    def _settle_open_end(self, table: FrameTable, frame: int, length: int) -> None:
        """The open-ended last frame turned out to hold ``length`` bytes (its stream ended there,
        checksum verified)."""
        with self._table_lock:
            if table.open_end and frame == len(table) - 1:
                logger.debug("%s: the last frame holds %d bytes", self.path, length)
                table.decomp_sizes[frame] = length
                table.open_end = False

    def export_seek_points(self, writer: SeekPointWriter) -> None:
        table = self.frames
        if self._crc_table is None:  # the first pass (not a conversion of an indexed file)
            self._warn_unchecked(table)
        self._verify_large_frames(table)
        assert not table.open_end, "the last frame's size is settled by decoding it to its end"
        crcs = self._complete_crcs(table)
        writer.put_seek_points(self.backend_name, self.seek_point_blobs(table, self.compressed_size))
        writer.put_seek_points(self.crc_table_name(), crcs.parts(len(table)))
        # The first pass read it all: it counts again from the next read.
        self._counted = False
        FRAME_CACHE.opened(self._token, 0)

    def _warn_unchecked(self, table: FrameTable) -> None:
        """Frames without a checksum of their own (``zstd --no-check``, python-zstandard's
        default, ``xz --check=none``): damage done before this first pass is read as data, and
        nothing can tell it from an intact file (found by fuzzing: a flipped byte in a stored
        block came back as a wrong byte). Later damage is caught by the block checksums the
        index records now."""
        global _unchecked_reported
        unchecked = sum(1 for frame in range(len(table)) if not self._self_checked(frame, table))
        if not unchecked:
            return
        with _unchecked_lock:
            _unchecked_reported += 1
            said = _unchecked_reported
        if said > UNCHECKED_REPORTED:  # (a tar of 1,000 class archives made without checksums)
            if said == UNCHECKED_REPORTED + 1:
                logger.warning("More compressed files without checksums; they are not named each")
            logger.debug("%s: frames without checksums", self.path)
            return
        fmt, count = self.format_name, len(table)
        if count == 1:
            which = f"its {fmt} frame carries no checksum"
        elif unchecked == count:
            which = f"none of its {count} {fmt} frames carries a checksum"
        else:
            which = f"{unchecked} of its {count} {fmt} frames carry no checksum"
        logger.warning(
            "%s: %s: damage from before this first mount cannot be detected (later damage is, by "
            "the checksums its index records now)",
            self.path,
            which,
        )

    def _complete_crcs(self, table: FrameTable) -> FrameCrcs:
        """The block checksums of every frame that needs them: frames the first pass skipped
        (the data of large members) are decoded for them now."""
        if self._crc_table is not None:
            return self._crc_table  # read from an index (a conversion of an indexed file)
        with self._inflight_lock:
            pending = list(self._ahead.values())
        # Frames still being decoded ahead collect their checksums when they finish: one that
        # finished after the table was made was left out of it (found by a flaky test).
        concurrent.futures.wait(pending)
        with self.data_errors():
            for frame in range(len(table)):
                if frame in self._collected:
                    continue
                self._read_on(frame, table, from_start=False)  # a cursor of the scan stopped inside
                if not self._needs_crcs(frame, table) or frame in self._collected:
                    continue
                if table.decomp_sizes[frame] <= self.whole_frame_limit:
                    self._decode_checked(frame, table)  # collects
                else:
                    self._read_on(frame, table, from_start=True)  # (_verify_large_frames did already)
        # From now on this reader checks against the table, like one that opened the index.
        self._crc_table = FrameCrcs(self._collected)
        self._collected = {}
        return self._crc_table

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
        table = FrameTable.unpack(found[1])
        crcs = FrameCrcs.from_parts(index.seek_point_parts(self.crc_table_name()), table.decomp_sizes)
        if crcs is None or any(self._needs_crcs(f, table) and not crcs.covers(f) for f in range(len(table))):
            raise InvalidIndexError(
                f"{self.path}: the index holds no block checksums for the {self.format_name} frames; "
                "rebuild it (--recreate-index)"
            )
        with self._table_lock:
            self._crc_table = crcs
            self._set_table(table)

    # --- reading ------------------------------------------------------------------------------
    def _count_file(self, table: FrameTable) -> None:
        """Count the file among those the cache's reads compete for, at its first read (or when
        asked to before, ``count_before_reads``): the archives of a union that are never read
        (shadowed by later ones) do not compete. A union of three copies of a 68 MB .tar.xz of
        24 MiB blocks, all reads served by the last: each read decoded up to its member in a
        block (330 ms on average) instead of the one file read being kept whole."""
        self._counted = True
        FRAME_CACHE.opened(self._token, table.size if self._largest_cached else 0)

    def count_before_reads(self) -> None:
        table = self._frames
        if table is not None and not self._counted:
            self._count_file(table)

    def pread(self, offset: int, size: int) -> bytes:
        table = self.frames
        if not self._counted:
            self._count_file(table)
        end = min(offset + size, table.size)
        if size <= 0 or offset < 0 or offset >= end:
            return b""
        pieces: List[bytes] = []
        frame = table.find(offset)
        last = table.find(end - 1)
        if self._ahead_depth and (
            offset == 0 or (self._last_frame <= frame <= self._last_frame + 1 and last > self._last_frame)
        ):
            # A read from the very start (the first mount's scan), or contiguous reads that moved
            # on into a new frame: a sequential pass (a small member read in pieces stays inside
            # one frame and triggers nothing).
            self._decode_ahead(table, last + 1)
        self._last_frame = last
        position = offset
        while position < end and frame < len(table):
            start = table.decomp_offsets[frame]
            length = table.decomp_sizes[frame]
            lo = position - start
            hi = min(end - start, length)
            if lo >= hi:
                break  # past the end of an open-ended frame that another thread just settled
            data = FRAME_CACHE.get((self._token, frame)) if length <= self.whole_frame_limit else None
            if data is None and length <= self.whole_frame_limit and self._partial(frame, table):
                pieces.append(self._stream_read(frame, lo, hi - lo, table, self._partial_pool(table)))
            elif data is None and (length > self.whole_frame_limit or self._scan_streams(frame, table)):
                pieces.append(self._stream_read(frame, lo, hi - lo, table))
            else:
                data = data if data is not None else self._cached_frame(frame, table)
                # One copy of the part wanted (frames may be cached as bytearray: never hand one out).
                pieces.append(bytes(data) if (lo, hi) == (0, length) else memoryview(data)[lo:hi].tobytes())
            position = start + hi
            frame += 1
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _partial(self, frame: int, table: FrameTable) -> bool:
        """Whether a read in a small frame decodes it only up to the blocks it needs (through a
        cursor, checked against the block checksums) instead of whole into the cache: when the
        cache cannot hold much of the file (random reads would mostly miss it, and a miss
        would decode the whole frame for one member). Asked only for frames not in the cache."""
        crcs = self._crc_table
        return (
            crcs is not None and not self._kept_whole() and crcs.covers(frame) and frame not in self._ahead
        )  # fmt: skip

    def _kept_whole(self) -> int:
        """What the cache grows to once frames are decoded again so that it holds all of this
        file, and of the other files read through it (a union, a folder): their size together
        when this file's frames are cached whole and that is at most ``KEPT_WHOLE_FACTOR`` times
        the cache size given; 0 (False) otherwise, and when the cache is off."""
        files = FRAME_CACHE.files()
        return files if self._largest_cached and FRAME_CACHE.keeps_whole(files) else 0

    def _partial_pool(self, table: FrameTable) -> InstancePool[_Cursor]:
        """As many cursors as frames of this file fit in ``PARTIAL_CURSOR_BYTES`` (each holds a
        decoder window up to a frame's size: xz keeps 8 MiB per block of `xz -6`, and reads that
        find a cursor behind them in their frame decode less), at least one per thread."""
        pool = self._partial_cursors
        if pool is None:
            with self._table_lock:
                if self._partial_cursors is None:
                    largest = max(table.decomp_sizes, default=1)
                    count = min(self.max_cursors, max(self.options.threads(), PARTIAL_CURSOR_BYTES // largest, 1))
                    self._partial_cursors = _cursor_pool(count)
                    self._partial_cursors.extent = table.size
                pool = self._partial_cursors
        return pool

    def _scan_streams(self, frame: int, table: FrameTable) -> bool:
        """Whether the first pass reads a large frame through a cursor (decoded ahead by a
        thread while the scan parses what is there) instead of waiting for it to be decoded
        whole: the first frame of an `xz -T` file holds 24 MiB, 0.75 s of decoding that the
        scan would otherwise only start after. Asked only for frames not in the cache."""
        return (
            self._crc_table is None
            and table.decomp_sizes[frame] >= SCAN_STREAM_MIN
            and frame not in self._ahead
            and frame not in self._inflight
        )

    def _via_cursor(self, frame: int, table: FrameTable) -> bool:
        """Whether a read of ``frame`` that misses the cache goes through a cursor (see ``pread``)."""
        return (
            table.decomp_sizes[frame] > self.whole_frame_limit
            or self._partial(frame, table)
            or self._scan_streams(frame, table)
        )

    def _park(self, frame: int, table: FrameTable) -> None:
        """Start decoding ``frame`` ahead as a stream for a sequential reader that is about to
        reach it (read in cursors: a frame too large to cache, or one of a file read in
        partial frames). Decoding it whole ahead instead held it twice over: whole, while the
        cursor that reads the frame before it also decoded ahead (xz blocks of 24 MiB read in
        order through the mount: peak RSS 120 MiB; streamed, 69 MiB). The first pass lets the
        stream get half a frame ahead: its scan only parses headers and takes over a stream's
        decoded pieces much faster than they come, so two frames decode on two cores at once
        (100,000-file .tar.xz of 24 MiB blocks: whole frames ahead 6.7-7.1 s and 116-125 MiB
        peak RSS; half a frame 6.7-6.8 s, 79-83 MiB; a quarter 8.3-8.5 s, 66 MiB). Later
        reads keep it a few pieces ahead (``DEPTH``)."""
        from .stream_ahead import DEPTH, PIECE, ReadAheadStream  # (imports this module)

        with self._inflight_lock:
            for stale in [f for f in self._parked if f < frame - 1]:
                self._parked.pop(stale).close()
            if frame in self._parked:
                return
            # One per decoding thread, the oldest closed first: runs in order that go backwards
            # through the file would otherwise leave a stream parked ahead of each of them.
            while self._parked and len(self._parked) >= max(1, self._ahead_depth):
                self._parked.pop(next(iter(self._parked))).close()
            half = min(table.decomp_sizes[frame], AHEAD_BYTES) // 2 // PIECE + 1
            depth = half if self._crc_table is None else DEPTH
            self._parked[frame] = ReadAheadStream(self._open_stream(frame, table), depth=depth)

    def _unpark(self, frame: int) -> Optional[FrameStream]:
        with self._inflight_lock:
            return self._parked.pop(frame, None)

    def _decode_ahead(self, table: FrameTable, first: int) -> None:
        if first < len(table) and table.decomp_sizes[first] >= SCAN_STREAM_MIN and self._via_cursor(first, table):
            self._park(first, table)
            return
        with self._inflight_lock:
            held = sum(table.decomp_sizes[frame] for frame in self._ahead)
            for frame in range(first, min(first + self._ahead_depth, len(table))):
                size = table.decomp_sizes[frame]
                if size > self.whole_frame_limit or (self._ahead and held + size > AHEAD_BYTES):
                    break
                if size >= SCAN_STREAM_MIN and self._via_cursor(frame, table):
                    break  # parked when the reader gets to the frame before it
                if frame in self._ahead or frame in self._inflight:
                    continue
                if FRAME_CACHE.get((self._token, frame)) is not None:
                    continue
                held += size
                if self._executor is None:
                    self._executor = concurrent.futures.ThreadPoolExecutor(
                        self._ahead_depth, thread_name_prefix=f"{self.format_name}-ahead"
                    )
                self._ahead[frame] = self._executor.submit(self._decode_checked, frame, table)

    def _cached_frame(self, frame: int, table: FrameTable) -> FrameData:
        try:
            return self._cached_frame_once(frame, table)
        except CorruptDataError as exc:
            if not isinstance(exc, ArchiveChangedError):
                self._damaged[frame] = str(exc)
            raise

    def _cached_frame_once(self, frame: int, table: FrameTable) -> FrameData:
        key = (self._token, frame)
        while True:
            damaged = self._damaged.get(frame)
            if damaged is not None:
                raise CorruptDataError(damaged)  # (a new one: raised again, one would grow its traceback)
            data = FRAME_CACHE.get(key)
            if data is not None:
                return data
            with self._inflight_lock:
                ahead = self._ahead.pop(frame, None)
            if ahead is not None:
                data = ahead.result()  # a decode error surfaces here, for this read
                FRAME_CACHE.put(key, data)
                return data
            with self._inflight_lock:
                event = self._inflight.get(frame)
                if event is None:
                    event = self._inflight[frame] = threading.Event()
                    break
            event.wait()  # another thread decodes it; on its failure we try ourselves
        try:
            if frame in self._verified and self._largest_cached and FRAME_CACHE.given != 0:
                # Decoded before and evicted since: reads go back and forth (in name order, a
                # folder whose members straddle two frames). With room for one large frame
                # only, every crossing would decode a frame again (24 MiB xz blocks: 0.4 s
                # each), so the cache grows to hold two; or all of a file that is at most
                # KEPT_WHOLE_FACTOR times the cache. A sequential scan (the first mount) never
                # gets here and keeps the smaller budget. (Not when the cache is off.)
                FRAME_CACHE.reserve(max(FRAMES_CACHED_AT_LEAST * self._largest_cached, self._kept_whole()))
            data = self._decode_checked(frame, table)
            FRAME_CACHE.put(key, data)
            return data
        finally:
            with self._inflight_lock:
                self._inflight.pop(frame, None)
            event.set()

    def _decode_checked(self, frame: int, table: FrameTable) -> FrameData:
        with self._decode_slots:
            with self.data_errors():
                data = self._decode_frame(frame, table)
        self.stats.frames_decoded += 1
        if len(data) != table.decomp_sizes[frame]:
            raise CorruptDataError(
                f"{self.path}: {self.format_name} frame at byte {table.comp_offsets[frame]} decompressed to "
                f"{len(data)} bytes instead of {table.decomp_sizes[frame]}"
            )
        crcs = self._crc_table
        if crcs is None:  # the first pass: every frame it decodes (see ``_partial``)
            if frame not in self._collected:
                with memoryview(data) as view:  # (frames may be anonymous mappings)
                    self._collected[frame] = crcs_of(view)
        elif self._needs_crcs(frame, table):
            with memoryview(data) as view:
                crcs.verify(self.path, frame, 0, [view], len(data))
        self._verified.add(frame)
        return data

    # --- large frames -------------------------------------------------------------------------
    def _stream_read(
        self, frame: int, position: int, size: int, table: FrameTable, cursors: Optional[InstancePool[_Cursor]] = None
    ) -> bytes:
        crcs = self._crc_table
        if crcs is None or not crcs.covers(frame):
            return self._stream_read_raw(frame, position, size, table, cursors)
        # Widened to whole blocks, checked, then cut (the cursor keeps the last block, so a
        # sequential reader's next read does not go back into the stream).
        block = crcs.block
        length = table.decomp_sizes[frame]
        lo = position // block * block
        hi = min(length, -(-min(position + size, length) // block) * block)
        if lo >= hi:
            return b""
        data = self._stream_read_raw(frame, lo, hi - lo, table, cursors)
        crcs.verify(self.path, frame, lo, [data], length)
        return data[position - lo : position - lo + size]

    def _stream_read_raw(
        self, frame: int, position: int, size: int, table: FrameTable, cursors: Optional[InstancePool[_Cursor]] = None
    ) -> bytes:
        start = table.decomp_offsets[frame]
        length = table.decomp_sizes[frame]
        with (cursors or self._cursors).acquire(start + position) as slot:
            cursor = slot.instance
            with self.data_errors():
                if (
                    cursor.frame != frame
                    or cursor.position - len(cursor.tail) > position
                    or (cursor.stream is None and position + size > cursor.position)
                ):
                    cursor.close()
                    parked = self._unpark(frame)
                    cursor.stream = parked if parked is not None else self._open_stream(frame, table)
                    cursor.frame, cursor.position, cursor.run = frame, 0, 0
                    cursor.ahead = parked is not None
                    if self._crc_table is None and frame not in self._collected:
                        cursor.collector = CrcCollector()  # the first pass records every frame
                head = b""
                if position < cursor.position:  # inside the bytes kept from the last read
                    head = cursor.tail[len(cursor.tail) - (cursor.position - position) :][:size]
                stream = cursor.stream
                if stream is None:  # at the end of its frame, and the read lies inside the kept block
                    return head
                # Forward by at most a small gap (a scan skips the data of small members).
                cursor.run = cursor.run + 1 if -len(cursor.tail) <= position - cursor.position <= SEQUENTIAL_GAP else 0
                if cursor.run >= SEQUENTIAL_RUN and self._ahead_depth and not cursor.ahead:
                    # A sequential reader (the first mount's scan, a copy): decode ahead in a
                    # thread of its own. Random reads never get here: what a thread decoded
                    # past their target would be thrown away (single-frame .tar.zst, 100
                    # random reads: 8.5 s without, 10.0 s with read-ahead).
                    from .stream_ahead import ReadAheadStream  # (imports this module)

                    cursor.stream = stream = ReadAheadStream(stream)
                    cursor.ahead = True
                collector = cursor.collector
                ended = False
                if cursor.position < position:
                    cursor.tail = b""  # what is kept must end where the cursor stands
                while cursor.position < position:  # skip forward, in bounded steps
                    step = min(position - cursor.position, 1 << 20)
                    if collector is not None:  # every byte goes through the checksums
                        skipped_data = stream.read(step)
                        collector.feed(skipped_data)
                        skipped = len(skipped_data)
                    else:
                        skipped = stream.skip(step)
                    if not skipped:
                        ended = True
                        break
                    cursor.position += skipped
                pieces = []
                remaining = size - len(head) if cursor.position == position + len(head) else 0
                while remaining > 0:
                    data = stream.read(remaining)
                    if not data:
                        ended = True
                        break
                    pieces.append(data)
                    remaining -= len(data)
                    cursor.position += len(data)
                if collector is not None:
                    for data in pieces:
                        collector.feed(data)
                if not ended and cursor.position == length:
                    if stream.read(1):  # reading past the end verifies the checksum
                        raise CorruptDataError(f"{self.path}: {self.format_name} frame {frame} is longer than indexed")
                    ended = True
                fresh = b"".join(pieces)
                if ended:
                    if table.open_end and frame == len(table) - 1:
                        self._settle_open_end(table, frame, cursor.position)
                    if cursor.position == table.decomp_sizes[frame]:
                        self._verified.add(frame)
                        if collector is not None and collector.position == cursor.position:
                            self._collected.setdefault(frame, collector.checksums())
                        # A read sized by the open end's bound (maybe before another thread
                        # settled it) gets what there is.
                        size = min(size, max(0, cursor.position - position))
                if fresh:
                    cursor.tail = fresh[-BLOCK:] if len(fresh) >= BLOCK else (cursor.tail + fresh)[-BLOCK:]
                if ended:
                    # The stream is done; the cursor keeps its place and its last block, so
                    # that the next reads in order (which start inside that block once widened
                    # to whole blocks) are served from it instead of decoding the frame again
                    # from its start.
                    frame_kept, position_kept, tail = cursor.frame, cursor.position, cursor.tail
                    cursor.close()
                    if position_kept == length:
                        cursor.frame, cursor.position, cursor.tail = frame_kept, position_kept, tail
            result = head + fresh if head else fresh
            if len(result) != size:
                raise CorruptDataError(
                    f"{self.path}: {self.format_name} frame at byte {table.comp_offsets[frame]} ends early"
                )
            slot.position = start + cursor.position - len(cursor.tail) if cursor.frame >= 0 else -1
            return result

    def _verify_large_frames(self, table: FrameTable) -> None:
        """Decode every large frame to its end once (the scan usually got close already), so that
        a corrupt file fails the first mount instead of serving unverified bytes later."""
        for frame, length in enumerate(table.decomp_sizes):
            if length > self.whole_frame_limit and frame not in self._verified:
                self._read_on(frame, table, from_start=True)

    def _read_on(self, frame: int, table: FrameTable, from_start: bool) -> None:
        """Stream a frame to its end from where the furthest idle cursor in it stopped (or, with
        ``from_start``, from its start when none did)."""
        start, length = table.decomp_offsets[frame], table.decomp_sizes[frame]
        stopped = [p - start for p in self._cursors.idle_positions() if start <= p < start + length]
        if not stopped and not from_start:
            return
        position = max(stopped, default=0)
        while position < length:
            step = min(length - position, 4 << 20)
            got = len(self._stream_read_raw(frame, position, step, table))
            position += got
            if got < step:
                break  # the open end, settled at its true size

    def close(self) -> None:
        try:
            executor, self._executor = self._executor, None
            if executor is not None:
                executor.shutdown(wait=True, cancel_futures=True)
            self._ahead.clear()
            with self._inflight_lock:
                parked, self._parked = list(self._parked.values()), {}
            for stream in parked:
                stream.close()
            self._cursors.close()
            if self._partial_cursors is not None:
                self._partial_cursors.close()
            FRAME_CACHE.drop(self._token)
        finally:
            super().close()
