"""Convert any supported archive into a seekable multi-frame ``.tar.zst`` with a ready index.

One pass: the source is decompressed front to back; every byte goes into independent zstd frames
of ``frame_size`` uncompressed bytes (content size and checksum in each, compressed on worker
threads) and, on the way, through the tar scanner into an ``IndexWriter``. The output is written
to a temporary file and renamed into place; the index -- rows, zstd frame table and the output's
identity -- is then committed where ``ratarmountcore.open(dst)`` looks for it, so the first mount
of the new file does not scan anything.

>>> convert_to_seekable_zstd("photos.tar.gz", "photos.tar.zst")   # doctest: +SKIP
"""

from __future__ import annotations

import array
import collections
import logging
import os
import sqlite3
import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Deque, Dict, List, Optional, Tuple

from .compression.base import CompressedReader
from .compression.frame_crcs import FrameCrcs, crcs_of
from .compression.framed import FrameTable
from .errors import (
    ArchiveError,
    IndexNotWritableError,
    IndexWriteError,
    NotFoundError,
    RatarmountError,
    UnsupportedFormatError,
)
from .formats import COMPRESSIONS, FormatId, is_tar_stream, sniff_bytes
from .index import full_folders, stale
from .index.fingerprint import ArchiveStats, archive_stats
from .index.locations import candidate_paths, check_named_folders, folder_writable
from .index.sqlite_index import IndexWriter, foreign_file, scan_options
from .io.readers import PlainFileReader, RandomAccessReader
from .options import OpenOptions
from .progress import Progress
from .tar.sample import tell_member_size

logger = logging.getLogger(__name__)

DEFAULT_FRAME_SIZE = 4 * 1024 * 1024
DEFAULT_LEVEL = 3
_PULL = 1024 * 1024


@dataclass(frozen=True)
class ConversionResult:
    path: str
    index_path: str
    layout: str  # "tar" or "single_file"
    frames: int
    decompressed_size: int
    compressed_size: int


class _LateStats:
    """Stands in for ``ArchiveStats`` while the output is still being written; the writer reads
    the fields only in ``commit``."""

    size = 0
    mtime_ns = 0
    fingerprint = ""

    def fill(self, stats: ArchiveStats) -> None:
        self.size, self.mtime_ns, self.fingerprint = stats.size, stats.mtime_ns, stats.fingerprint


class FrameWriter:
    """Cuts a byte stream into frames of ``frame_size`` bytes, compresses them on ``threads``
    workers (at most ``2 * threads`` frames in flight) and appends them to ``out`` in order."""

    def __init__(self, out: BinaryIO, frame_size: int, level: int, threads: int) -> None:
        import zstandard

        self._zstd = zstandard
        self._out = out
        self._frame_size = frame_size
        self._level = level
        self._threads = max(1, threads)
        self._executor = ThreadPoolExecutor(self._threads, thread_name_prefix="zstd-frame")
        self._inflight: Deque[Tuple["Future[Tuple[bytes, array.array[int]]]", int]] = collections.deque()
        self._pending = bytearray()
        self._local = threading.local()
        self._offset = 0
        self.table = FrameTable()
        #: Block checksums of every frame (see ``frame_crcs``): those of frames too large to be
        #: read whole check their reads; with those of the others, a random read decodes its
        #: frame only up to the blocks it needs, as in an index a mount's scan built (1,000
        #: random reads of 20-200 KB members in 4 MiB frames through the mount: 4.4 -> 2.x s).
        self.crcs = FrameCrcs({})

    def _compress(self, chunk: bytes) -> "Tuple[bytes, array.array[int]]":
        compressor = getattr(self._local, "compressor", None)
        if compressor is None:
            compressor = self._local.compressor = self._zstd.ZstdCompressor(
                level=self._level, write_checksum=True, write_content_size=True
            )
        return compressor.compress(chunk), crcs_of(chunk)

    def write(self, data: bytes) -> None:
        self._pending += data
        size = self._frame_size
        if len(self._pending) >= size:
            view = memoryview(self._pending)
            cut = len(self._pending) - len(self._pending) % size
            for start in range(0, cut, size):
                self._submit(bytes(view[start : start + size]))
            view.release()
            del self._pending[:cut]

    def _submit(self, chunk: bytes) -> None:
        self._inflight.append((self._executor.submit(self._compress, chunk), len(chunk)))
        while len(self._inflight) > 2 * self._threads:
            self._write_oldest()

    def _write_oldest(self) -> None:
        future, length = self._inflight.popleft()
        frame, crcs = future.result()
        self._out.write(frame)
        self.crcs.by_frame[len(self.table)] = crcs
        self.table.append(self._offset, len(frame), length, 1)  # 1: with its checksum
        self._offset += len(frame)

    def finish(self) -> FrameTable:
        if self._pending or (not self.table and not self._inflight):
            # (Nothing at all: one empty frame, since a zstd file of no frame is not valid.)
            self._submit(bytes(self._pending))
            self._pending.clear()
        while self._inflight:
            self._write_oldest()
        self._executor.shutdown()
        return self.table

    def abort(self) -> None:
        for future, _ in self._inflight:
            future.cancel()
        self._executor.shutdown(wait=True)


class TeeReader:
    """A ``RandomAccessReader`` over a source that is read exactly once, front to back.

    Every byte pulled from the source is handed to ``sink`` in order. Reads may go back at most
    ``lookback`` bytes behind the furthest byte pulled (the tar scanner only moves forward, apart
    from its read-ahead buffer); skipping ahead pulls, and forwards, everything in between.
    """

    def __init__(
        self,
        source: RandomAccessReader,
        sink: Callable[[bytes], None],
        on_pull: Optional[Callable[[int], None]] = None,
        lookback: int = 16 * 1024 * 1024,
    ) -> None:
        self._source = source
        self._sink = sink
        self._on_pull = on_pull
        self._lookback = lookback
        self._chunks: Deque[Tuple[int, bytes]] = collections.deque()
        self._buffered = 0
        self._pulled = 0
        self._eof = False

    def _pull(self, until: int) -> None:
        while self._pulled < until and not self._eof:
            data = self._source.pread(self._pulled, _PULL)
            if not data:
                self._eof = True
                break
            self._sink(data)
            self._chunks.append((self._pulled, data))
            self._buffered += len(data)
            self._pulled += len(data)
            while self._chunks and self._buffered - len(self._chunks[0][1]) >= self._lookback:
                self._buffered -= len(self._chunks.popleft()[1])
            if self._on_pull is not None:
                self._on_pull(self._pulled)

    def pread(self, offset: int, size: int) -> bytes:
        self._pull(offset + size)
        if self._chunks and offset < self._chunks[0][0]:
            raise RuntimeError(f"converter: read at {offset} went back further than its buffer")
        pieces: List[bytes] = []
        end = offset + size
        for start, data in self._chunks:
            stop = start + len(data)
            if stop <= offset:
                continue
            if start >= end:
                break
            pieces.append(data[max(0, offset - start) : min(len(data), end - start)])
        return b"".join(pieces)

    @property
    def size(self) -> int:
        self.drain()
        return self._pulled

    def drain(self) -> int:
        self._pull(1 << 62)
        return self._pulled

    def close(self) -> None:
        pass


def _index_writer(dst_path: str, options: OpenOptions, stats: Any, build_options: Dict[str, str]) -> IndexWriter:
    """A writer of the output's index at the first place it can be made, tried in the order a
    mount tries them. Where none can be, the conversion fails as a first mount would, naming
    every place and why (it wrote the output without its index, with a warning, or failed where
    the first place could not be made although the next could: found by fuzzing)."""
    causes: Dict[str, str] = {}
    for target in candidate_paths(dst_path, options.index):
        if foreign_file(target):
            causes[target] = "not an index of ours, perhaps another program's, left alone"
        elif not folder_writable(target):
            causes[target] = "its folder cannot be written"
        else:
            try:
                return IndexWriter(target, stats, dst_path, build_options)  # type: ignore[arg-type]
            except (OSError, sqlite3.Error) as exc:
                causes[target] = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    tried = ", ".join(f"{path} ({cause})" for path, cause in causes.items())
    raise IndexNotWritableError(
        f"{dst_path}: cannot write an index to any of {tried}; "
        "use --index-file or --index-folders to name a writable place"
    )


def convert_to_seekable_zstd(
    src_path: str,
    dst_path: str,
    frame_size: int = DEFAULT_FRAME_SIZE,
    level: int = DEFAULT_LEVEL,
    options: Optional[OpenOptions] = None,
    overwrite: bool = False,
) -> ConversionResult:
    """Write ``dst_path`` (multi-frame zstd of the decompressed ``src_path``) and its index.

    ``src_path`` may be a plain tar or any compressed file ratarmountcore reads (a compressed
    non-tar file becomes a single-file archive, as when mounting it). ``options.recursive`` and
    ``options.compression`` shape the index exactly as ``ratarmountcore.open(dst, options)``
    expects them; ``options.index`` says where the index goes and whether to show progress.
    """
    from .compression.registry import open_compressed
    from .compression.zstd import ZstdReader
    from .sources.single_file import decompressed_name, single_file_record
    from .tar.indexing import index_tar

    options = options or OpenOptions()
    if frame_size < 1:
        raise ValueError("frame_size must be positive")
    if os.path.exists(src_path) and not os.path.isfile(src_path):
        raise ArchiveError(f"{src_path}: not a regular file")
    out_folder = os.path.dirname(os.path.abspath(dst_path))
    if not os.path.isdir(out_folder):
        raise NotFoundError(2, f"{out_folder}: no such folder for the output")
    check_named_folders(options.index)
    index_file = options.index.index_file
    if index_file and os.path.realpath(os.path.expanduser(index_file)) == os.path.realpath(dst_path):
        # (The index is committed first, then the output renamed over it: no index at all.)
        raise ArchiveError(f"{dst_path}: the index file would overwrite the output (name another --index-file)")
    if os.path.exists(dst_path):
        if os.path.exists(src_path) and os.path.samefile(src_path, dst_path):
            raise ArchiveError(f"{dst_path}: the output would overwrite the input")
        if not overwrite:
            raise ArchiveError(f"{dst_path}: already exists (overwrite=True replaces it)")
    try:
        plain = PlainFileReader(src_path)
    except FileNotFoundError:
        raise NotFoundError(2, f"{src_path}: no such file") from None
    except OSError as exc:
        raise RatarmountError(f"{src_path}: cannot open ({exc.strerror})") from None

    source: RandomAccessReader = plain
    stale.remove_abandoned(dst_path)
    temp_path = f"{dst_path}.tmp-{uuid.uuid4().hex[:12]}"
    stale.register(temp_path)
    writer: Optional[IndexWriter] = None
    frames: Optional[FrameWriter] = None
    compressed: Optional[CompressedReader] = None
    try:
        if plain.size == 0:
            raise ArchiveError(f"{src_path}: file is empty")
        fmt = sniff_bytes(plain.pread(0, 512))
        if fmt in COMPRESSIONS:
            compressed = open_compressed(src_path, plain, fmt, options.compression)
            compressed.expect_sequential_reads()
            layout = "tar" if is_tar_stream(compressed.head(512), compressed.head) else "single_file"
            tell_member_size(compressed)
            source = compressed.scan_reader()
        elif fmt is FormatId.TAR:
            layout = "tar"
        else:
            raise UnsupportedFormatError(f"{src_path}: neither a tar archive nor a supported compressed file")

        # Must match what sources.archive.open_archive expects for the output, or it rescans.
        build_options = {
            **scan_options(FormatId.ZSTD.value, options.recursive, options.strip_tar_extension),
            **ZstdReader.index_options_for(options.compression),
            "layout": layout,
        }
        late_stats = _LateStats()
        try:  # (first: an output that cannot be written at all is the error to report)
            out_file = open(temp_path, "wb")  # noqa: SIM115 - closed by the with below
            stale.hold_lock(out_file.fileno())
        except OSError as exc:  # (named as the user named it, not by the temporary name)
            raise RatarmountError(f"{dst_path}: cannot write ({exc.strerror})") from None
        try:
            writer = _index_writer(dst_path, options, late_stats, build_options)
        except IndexNotWritableError:
            out_file.close()
            raise

        # A share of the input where the compressed bytes read tell progress (the first call
        # starts the count), else the decompressed bytes so far (bzip2).
        bar = Progress(f"Converting {src_path}", plain.size, enabled=options.index.progress)
        read = compressed.compressed_progress if compressed is not None and bar.enabled else None
        if read is not None and read() is None:
            bar.total = read = None

        def on_pull(position: int) -> None:
            bar.update(min(read() or 0, plain.size) if read is not None else position)

        with out_file as out:
            frames = FrameWriter(out, frame_size, level, options.compression.threads())
            tee = TeeReader(source, frames.write, on_pull)
            try:
                try:
                    if layout == "tar":
                        index_tar(
                            tee, None, writer, src_path, False, options.recursive,
                            strip_tar_extension=options.recursive and options.strip_tar_extension,
                        )  # fmt: skip
                    total = tee.drain()
                except RatarmountError:
                    if compressed is not None:
                        compressed.end_scan()  # a failing decoder explains a damaged stream best
                    raise
                if compressed is not None:
                    compressed.end_scan()
                table = frames.finish()
            finally:
                bar.close()
        fd = os.open(temp_path, os.O_RDONLY)
        try:
            stats = archive_stats(fd)
            st = os.fstat(fd)
        finally:
            os.close(fd)
        late_stats.fill(stats)
        owner = (st.st_uid, st.st_gid)
        if layout == "single_file":
            writer.add(single_file_record(decompressed_name(dst_path), total, st.st_mode, stats, owner))
        writer.put_seek_points(ZstdReader.backend_name, ZstdReader.seek_point_blobs(table, stats.size))
        writer.put_seek_points(ZstdReader.crc_table_name(), frames.crcs.parts(len(table)))
        writer.commit(stats.mtime_ns, *owner)  # (before the output is in place: a failure leaves neither)
        index_path = writer.final_path
        try:
            os.replace(temp_path, dst_path)
        except BaseException:
            os.unlink(index_path)
            raise
        logger.info(
            "Wrote %s: %d frames, %d -> %d bytes%s",
            dst_path,
            len(table),
            total,
            stats.size,
            f", index {index_path}",
        )
        return ConversionResult(dst_path, index_path, layout, len(table), total, stats.size)
    except BaseException as exc:
        if frames is not None:
            frames.abort()
        if writer is not None:
            writer.abort()
        try:
            os.unlink(temp_path)
        except FileNotFoundError:
            pass
        if isinstance(exc, sqlite3.Error) and writer is not None:  # (the disk filled up)
            cause = full_folders.explained(exc, writer.free_at_abort)
            raise IndexWriteError.of(dst_path, writer.final_path, cause) from None
        if isinstance(exc, ArchiveError):  # (as a mount names it)
            raise exc.naming(src_path) from None
        raise
    finally:
        stale.unregister(temp_path)
        if compressed is not None and source is not compressed:
            source.close()  # the first pass's reader over a decoder elsewhere
        (compressed or source).close()
        plain.close()
