"""bzip2: ``rapidgzip.IndexedBzip2File`` (parallel block decoding).

Seek points are the natural bzip2 block boundaries (``block_offsets()``: compressed bit offset
-> decompressed byte offset), so ``seek_point_spacing`` does not apply. Every block carries a
CRC32 that the (parallel) decoder checks whenever it decodes the block, before handing out any
of it, so corrupt data fails the reads that touch it (and the first mount, which decodes
everything).

The parallel decoder also decodes the blocks after the one asked for, and a damaged one among
them fails the read of intact blocks before it (rapidgzip reports the error it met ahead). A
read that fails so is redone block by block: each block it needs is cut out of the file at its
bit offsets and decoded alone by the standard library (as a stream of one block, whose CRC it
checks), so only the reads that touch damage fail.
"""

from __future__ import annotations

import bisect
import bz2
import concurrent.futures
import io
import logging
import struct
import threading
from typing import Any, ClassVar, Dict, List, Optional, Tuple, Union

from ..errors import ArchiveChangedError, CorruptDataError
from ..formats import FormatId
from .base import FdFile
from .pooled import PooledReader

logger = logging.getLogger(__name__)

#: Blocks decoded ahead, each on a thread, for a reader going through the archive in order.
BLOCKS_AHEAD = 2
#: The name of those threads.
AHEAD_THREAD = "ratarmount-bzip2-ahead"
#: A block's first 48 bits, and those of the marker that ends a stream.
BLOCK_MAGIC = 0x314159265359
END_MAGIC = 0x177245385090


def ends_with_end_marker(tail: bytes) -> bool:
    """Whether ``tail`` (the last 11 bytes of a file, or all of it) ends as a bzip2 stream does:
    the end-of-stream marker, the combined CRC-32 and 0-7 zero bits of padding."""
    value, bits = int.from_bytes(tail, "big"), 8 * len(tail)
    for padding in range(8):
        if bits >= 80 + padding and (value >> (32 + padding)) & ((1 << 48) - 1) == END_MAGIC:
            return True
    return False


def pack_offsets(offsets: Dict[int, int]) -> bytes:
    flat = [v for pair in sorted(offsets.items()) for v in pair]
    return struct.pack(f"<{len(flat)}q", *flat)


def unpack_offsets(payload: bytes) -> Dict[int, int]:
    flat = struct.unpack(f"<{len(payload) // 8}q", payload)
    return dict(zip(flat[0::2], flat[1::2]))


class Bzip2Reader(PooledReader):
    backend_name: ClassVar[str] = "rapidgzip_bzip2"
    format_name: ClassVar[str] = "bzip2"
    format_id: ClassVar[FormatId] = FormatId.BZIP2
    reads_in_step: ClassVar[bool] = False
    #: One decoder of all cores by default, not two: rapidgzip's parallel bzip2 reader decodes
    #: the blocks after the one asked for on its other threads, so two readers on 2 cores ran 4
    #: threads of mostly speculative work against each other. With one (2 vCPUs, interleaved
    #: runs): 1,000 random reads from the 10,000-file .tar.bz2 0.86-0.89 s instead of 1.31-1.95 s
    #: with peak RSS 77-79 instead of 105-117 MiB; 8 processes reading 4,000 files 1.44-1.52
    #: instead of 2.44-3.19 s; 300 of the 100,000-file one 13.0 instead of 20.8 s; one reader of
    #: the 100,000-file one and sequential reads unchanged. Single-threaded decoders for the
    #: span cache (as for gzip) were no answer: rapidgzip's serial bzip2 decoder is its old,
    #: slower one (1,000 random reads of the 100,000-file archive +35%).
    threads_within_cores: ClassVar[bool] = True
    threads_call_python: ClassVar[bool] = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: (bit offset, decompressed offset) of every block and end marker, from the index.
        self._blocks: Optional[List[Tuple[int, int]]] = None
        #: Their decompressed offsets, for bisecting.
        self._block_starts: Optional[List[int]] = None
        #: Set once a read met a damaged block: from then on every read goes block by block.
        #: The parallel decoder fails each read whose look-ahead reaches the damaged block, and
        #: was made anew for the next: reads of intact bytes beside the damage took ~1 s each
        #: (8 KiB) and 20-27 s each through a mount (128 KiB), a 3 MB file 2 minutes (found
        #: by fuzzing).
        self._damaged = False
        #: Blocks found damaged, by bit offset: their error's message, raised again without decoding.
        self._bad: Dict[int, str] = {}
        #: The block decoded alone last (bit offset, bytes): reads in order without a span cache.
        self._last_block: Optional[Tuple[int, bytes]] = None
        #: Span-cache misses (see ``_decode_span_start``): where the last one's block ended, and
        #: the next blocks being decoded ahead for a reader going in order (start -> its bytes).
        self._miss_end = -1
        #: How many misses in a row each began where the one before ended.
        self._run = 0
        self._ahead_lock = threading.Lock()
        self._ahead: Dict[int, "concurrent.futures.Future[bytes]"] = {}
        self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = None

    def pread(self, offset: int, size: int) -> bytes:
        if self._damaged:
            return self._read_blocks(offset, size)
        try:
            return super().pread(offset, size)
        except CorruptDataError as exc:
            return self._block_by_block(exc, offset, size)

    def preadinto(self, offset: int, view: memoryview) -> int:
        if self._damaged:
            data = self._read_blocks(offset, len(view))
        else:
            try:
                return super().preadinto(offset, view)
            except CorruptDataError as exc:
                data = self._block_by_block(exc, offset, len(view))
        view[: len(data)] = data
        return len(data)

    def _block_by_block(self, exc: CorruptDataError, offset: int, size: int) -> bytes:
        """The read that failed with ``exc``, redone one block at a time (see the module's
        docstring), as every read after it is; raises ``exc`` again where there is nothing to
        redo it with."""
        if self._size is None or self._block_table() is None or isinstance(exc, ArchiveChangedError):
            raise exc
        if not self._damaged:
            logger.debug("%s: a read failed (%s); reading block by block from now on", self.path, exc)
            self._damaged = True
        return self._read_blocks(offset, size)

    def _read_blocks(self, offset: int, size: int) -> bytes:
        """``pread`` once damage was met: block by block, through the span cache where it serves
        the read (the size and the block table are known by then)."""
        assert self._size is not None
        end = min(offset + size, self._size)
        if end <= offset:
            return b""
        spans = self._spans
        if spans is not None and spans.covers(offset, end - offset):
            return spans.read(offset, end - offset, lambda start, stop, _need: self._decode_range(start, stop))
        return self._decode_range(offset, end)

    def _decode_range(self, offset: int, end: int) -> bytes:
        """Decompressed bytes ``[offset, end)``, each block they touch decoded alone."""
        blocks = self._block_table()
        assert blocks is not None and self._block_starts is not None
        first = max(0, bisect.bisect_right(self._block_starts, offset) - 1)
        pieces = []
        for (bit, start), (next_bit, stop) in zip(blocks[first:], blocks[first + 1 :]):
            if start >= end:
                break
            if stop > start and stop > offset:  # (an end marker decodes to nothing)
                data = self._checked_block(bit, next_bit, stop - start)
                pieces.append(data[max(0, offset - start) : end - start])
        return b"".join(pieces)

    def _checked_block(self, bit: int, next_bit: int, size: int) -> bytes:
        """``_decode_block``, remembering the damaged blocks and the last one decoded."""
        bad = self._bad.get(bit)
        if bad is not None:
            raise CorruptDataError(bad)  # (a new one: raised again, one would grow its traceback)
        last = self._last_block
        if last is not None and last[0] == bit:
            return last[1]
        try:
            data = self._decode_block(bit, next_bit, size)
        except CorruptDataError as exc:
            self._bad[bit] = str(exc)
            raise
        self._last_block = (bit, data)
        return data

    # --- span-cache misses: one block, decoded alone -------------------------------------------
    # A miss needs one block (the spans are the blocks). rapidgzip's parallel reader decodes it
    # and, on its other threads, the blocks after it, which a random reader never uses; the
    # decoder holds ~50 MiB. The standard library decodes the block alone, as fast for a random
    # read on 2 cores (a 1.1 MB block of the 100,000-file benchmark archive: 50 ms, against
    # 58 ms a read through the parallel decoder), with half the CPU and no decoder. A reader
    # going in order gets the next blocks decoded ahead, one thread each (bz2 releases the GIL),
    # as the parallel decoder did (20,000 files of that archive in order in-process: 2.1 s
    # with the parallel decoder, 3.6 s with one block ahead, 2.1 s with two). Through a mount,
    # peak RSS of the benchmark's 100,000-file archive (random reads, then every file in order)
    # 131 -> 101 MiB. Large reads keep the parallel decoder, and so does an archive that the
    # span cache holds whole (decoded whole from the mount on, ``decode_ahead``): with the
    # standard library's decoding on threads, the 10,000-file one's peak RSS rose 72 -> 98 MiB.
    def _blocks_alone(self) -> bool:
        """Whether span-cache misses decode their block alone: a stream larger than the cache."""
        return self._size is not None and self._size > self.options.cache_size

    def _span_starts_without_decoder(self) -> Optional[List[int]]:
        if not self._blocks_alone() or self._block_table() is None or self._block_starts is None:
            return None  # (the parallel decoder's, as before: see above)
        return sorted(set(self._block_starts))

    def _decode_span_start(self, start: int, end: int) -> Optional[bytes]:
        if self._damaged or not self._blocks_alone():
            return None  # (a stream the cache holds is decoded whole, see the comment above)
        stop = self._block_end(start)
        if stop is None:
            return None
        self._run = self._run + 1 if self._miss_end == start else 0
        self._miss_end = stop
        data = self._take_ahead(start)
        if self._run >= 2:  # (not for one read across two blocks: a member's, read at random)
            self._decode_ahead_from(stop)
        return data if data is not None else self._decode_range(start, stop)

    def _block_end(self, start: int) -> Optional[int]:
        """Where the block that starts at ``start`` ends (None: no block starts there)."""
        starts = self._block_starts
        if starts is None or self._size is None:
            return None
        after = bisect.bisect_right(starts, start)
        if after == 0 or starts[after - 1] != start:
            return None
        return starts[after] if after < len(starts) else self._size

    def _take_ahead(self, start: int) -> Optional[bytes]:
        with self._ahead_lock:
            ahead = self._ahead.pop(start, None)
        if ahead is None:
            return None
        try:
            return ahead.result()
        except Exception as exc:  # noqa: BLE001 - decoded again by the read, which raises it there
            logger.debug("%s: decoding the block at %d ahead failed: %s", self.path, start, exc)
            return None

    def _decode_ahead_from(self, start: int) -> None:
        """Decode the ``BLOCKS_AHEAD`` blocks from ``start`` on threads, those not yet begun."""
        for _ in range(BLOCKS_AHEAD):
            stop = self._block_end(start)
            if stop is None:
                return
            with self._ahead_lock:
                if self._closing:
                    return
                while len(self._ahead) >= 2 * BLOCKS_AHEAD:  # the oldest: its reader moved elsewhere
                    self._ahead.pop(next(iter(self._ahead))).cancel()
                if start not in self._ahead:
                    if self._executor is None:
                        self._executor = concurrent.futures.ThreadPoolExecutor(
                            BLOCKS_AHEAD, initializer=lambda: setattr(threading.current_thread(), "name", AHEAD_THREAD)
                        )
                    self._ahead[start] = self._executor.submit(self._decode_range, start, stop)
            start = stop

    def close(self) -> None:
        with self._ahead_lock:  # (no block is submitted after this)
            self._closing = True
            executor, self._executor = self._executor, None
            self._ahead.clear()
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)  # (the file they read closes next)
        super().close()

    def _block_table(self) -> Optional[List[Tuple[int, int]]]:
        if self._blocks is None and self._payload_loader is not None:
            blocks = sorted(unpack_offsets(self._payload_loader()).items())
            self._block_starts = [decompressed for _bit, decompressed in blocks]  # (once, not per read)
            self._blocks = blocks
        return self._blocks

    def _decode_block(self, bit: int, next_bit: int, size: int) -> bytes:
        """The block at bits ``[bit, next_bit)`` of the file, decoded alone and checked."""
        first = bit // 8
        raw = self.raw_pread(first, -(-next_bit // 8) - first)
        count = next_bit - bit
        value = int.from_bytes(raw, "big")
        bits = (value >> (len(raw) * 8 - (bit - first * 8) - count)) & ((1 << count) - 1)
        if count < 80 or bits >> (count - 48) != BLOCK_MAGIC:
            raise CorruptDataError(f"{self.path}: corrupt bzip2 data (no block starts at bit {bit})")
        crc = (bits >> (count - 80)) & 0xFFFFFFFF  # (a stream of one block: its CRC is the block's)
        stream = (((bits << 48) | END_MAGIC) << 32) | crc
        length = count + 80
        padding = -length % 8
        with self.data_errors():
            data = bz2.decompress(b"BZh9" + (stream << padding).to_bytes((length + padding) // 8, "big"))
        if len(data) != size:
            raise CorruptDataError(
                f"{self.path}: corrupt bzip2 data (the block at bit {bit} holds {len(data)} bytes, not {size})"
            )
        return data

    def truncation(self, failure: CorruptDataError) -> Optional[str]:
        # rapidgzip says "End of file reached!" when its decoder runs out of input; the file is
        # truncated when, besides, it does not end with a stream's end marker (48 bits, then the
        # stream's CRC-32 and fewer than 8 bits of padding). Trailing garbage ends without one
        # too, but then the decoder meets a bad block, not the end of the file.
        if isinstance(failure, ArchiveChangedError) or "end of file" not in str(failure).lower():
            return None
        if ends_with_end_marker(self.raw_pread(max(0, self.compressed_size - 11), 11)):
            return None
        return "the file ends inside a stream"

    def _open_decoder(self, raw: Union[str, FdFile], threads: int) -> Any:
        import rapidgzip

        # Never one thread: rapidgzip's single-threaded bzip2 reader hands out a block's bytes
        # before it checks the block's CRC (at the block's end), so a read that stopped inside
        # a damaged block got wrong bytes (-P 1, or a decoder's share of one core). The
        # parallel reader decodes whole blocks and checks each before any byte of it is read.
        return rapidgzip.IndexedBzip2File(raw, parallelization=max(2, threads))

    def _load_seek_points(self, decoder: Any, payload: bytes) -> None:
        decoder.set_block_offsets(unpack_offsets(payload))

    def _span_starts(self, decoder: Any) -> Optional[List[int]]:
        return sorted(set(decoder.block_offsets().values()))

    def _finish(self, decoder: Any) -> int:
        return int(decoder.seek(0, io.SEEK_END))  # a truncated stream raises on the way

    def _export(self, decoder: Any) -> bytes:
        return pack_offsets(decoder.block_offsets())

    def head(self, size: int) -> bytes:
        """Decode just the first block with the standard library."""
        out = bytearray()
        offset = 0
        decompressor = bz2.BZ2Decompressor()
        with self.data_errors():
            while len(out) < size:
                if decompressor.eof:  # (the next stream of a multi-stream file, if any)
                    rest = decompressor.unused_data
                    if not rest:
                        rest = self.raw_pread(offset, 64 * 1024)
                        offset += len(rest)
                    if not rest.strip(b"\0"):
                        break
                    decompressor = bz2.BZ2Decompressor()
                    out += decompressor.decompress(rest, size - len(out))
                    continue
                if decompressor.needs_input:
                    chunk = self.raw_pread(offset, 64 * 1024)
                    if not chunk:
                        break
                    offset += len(chunk)
                else:
                    chunk = b""
                out += decompressor.decompress(chunk, size - len(out))
        return bytes(out[:size])
