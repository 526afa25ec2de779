"""gzip: ``rapidgzip.RapidgzipFile`` (parallel), fallback ``indexed_gzip.IndexedGzipFile``.

Integrity: gzip has one CRC32 per member, which can only be checked by decompressing the member
from its start. Both backends decompress the whole file once while the index is built (rapidgzip
verifies CRC32 on that pass; for indexed_gzip ``build_full_index`` does), so a corrupt file fails
the first mount with ``CorruptDataError``. Later random reads start at seek points, where
deflate's structure catches only some damage: that pass also records a CRC-32C per 16 KiB block
of decompressed data (``block_crcs``), and every later read is checked against it, so damage
after indexing (same size and mtime, outside the sampled fingerprint) fails the reads it touches
instead of returning wrong bytes. Truncation is detected at the end of the first pass.
"""

from __future__ import annotations

import collections
import io
import logging
import struct
import threading
import zlib
from typing import Any, ClassVar, Dict, List, Optional, Tuple, Union

from ..errors import CorruptDataError, InvalidIndexError, TruncatedArchiveError
from ..formats import FormatId
from ..io.readers import RandomAccessReader
from ..options import CompressionOptions
from . import checked_blocks
from .base import FdFile, SeekPointSource, SeekPointWriter, gzip_zero_padded, pack_seek_points, read_fully
from .block_crcs import BLOCK, TABLE_NAME, BlockCrcs, CrcCollector, CrcScan
from .deflate_resume import DeflateResumer
from .pooled import DIRECT_READ_MIN, PooledReader
from .scan_process import DecoderProcess, DecoderStartError, ProcessScan

logger = logging.getLogger(__name__)

MIN_SPACING = 64 * 1024
MAX_SPACING = 1024 * 1024 * 1024
#: Decoders for large reads and scans use seek points at least this far apart (compressed bytes):
#: rapidgzip decodes in parallel chunk by chunk, and smaller chunks cost it more overhead.
PARALLEL_CHUNK = 1024 * 1024
#: Last blocks of large reads kept for the sequential readers that continue them.
AHEAD_KEPT = 8
#: A read that begins at most this far after the end of a recent one continues it: a tar's next
#: member follows the last one's data after its header and padding (pax records included).
SEQUENTIAL_GAP = 64 * 1024
#: Ends of recent reads kept to tell reads in order from random ones (several readers at once).
ENDS_KEPT = 16
#: Reads at least this large go to the parallel decoders wherever they start.
PARALLEL_READ_MIN = 4 * PARALLEL_CHUNK
#: Small reads, each beginning exactly where the last one ended, this many in a row: a member
#: streamed in small pieces (``shutil.copyfileobj``'s 64 KiB through the Python API), which the
#: parallel decoders take over (a 440 MB member in 64 KiB pieces, in process: 1.95 -> 1.07 s).
STREAM_RUN = 8
#: The empty member that ends a BGZF file (bgzip, samtools).
BGZF_EOF = bytes.fromhex("1f8b08040000000000ff0600424302001b0003000000000000000000")


def thin_gztool_index(payload: bytes, min_gap: int) -> bytes:
    """The same gztool-format index (version 0, as rapidgzip exports it) keeping only the seek
    points at least ``min_gap`` compressed bytes apart; anything unexpected: ``payload`` as it is."""
    if len(payload) < 32 or payload[:16] != bytes(8) + b"gzipindx":
        return payload
    (have, _capacity) = struct.unpack_from(">QQ", payload, 16)
    position = 32
    kept: List[bytes] = []
    last = -min_gap
    for _ in range(have):
        if position + 24 > len(payload):
            return payload
        _out, compressed, _bits, window = struct.unpack_from(">QQII", payload, position)
        end = position + 24 + window
        if end > len(payload):
            return payload
        if compressed - last >= min_gap:
            kept.append(payload[position:end])
            last = compressed
        position = end
    return payload[:16] + struct.pack(">QQ", len(kept), len(kept)) + b"".join(kept) + payload[position:]


def _slice_pieces(start: int, pieces: List[Any], low: int, high: int) -> bytes:
    """Bytes ``[low, high)`` of the consecutive ``pieces`` that begin at ``start``."""
    out = []
    for piece in pieces:
        end = start + len(piece)
        if end > low and start < high:
            out.append(bytes(piece[max(0, low - start) : min(len(piece), high - start)]))
        start = end
    return b"".join(out)


class _GzipReader(PooledReader):
    """Both backends. Every read after the first pass is checked against the CRC-32C of each
    16 KiB block of decompressed data, recorded by that pass (``block_crcs``)."""

    format_name: ClassVar[str] = "gzip"
    format_id: ClassVar[FormatId] = FormatId.GZIP
    #: Seek-point spacing when the options give none.
    default_spacing: ClassVar[int] = 1024 * 1024

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._crcs: Optional[BlockCrcs] = None
        self._crc_scan: Optional[CrcScan] = None
        #: The last block of recent large reads (checked), by its start: the next sequential read
        #: continues from its end.
        self._ahead: Dict[int, Tuple[int, bytes]] = {}
        self._ahead_lock = threading.Lock()
        #: Where recent reads end (noted as they start, oldest first) -> how many reads in a row,
        #: each beginning exactly where the last ended, end there, and whether the parallel
        #: decoders serve this one (``_parallel``).
        self._recent: "collections.OrderedDict[int, Tuple[int, bool]]" = collections.OrderedDict()
        self._recent_lock = threading.Lock()
        #: This reader's key in the process's cache of checked blocks (``checked_blocks.py``).
        self._checked_token = checked_blocks.new_token()

    @classmethod
    def index_options_for(cls, options: CompressionOptions) -> Dict[str, str]:
        recorded = super().index_options_for(options)
        recorded["block_checksums"] = f"crc32c/{BLOCK}"  # indexes without them are rebuilt
        if options.seek_point_spacing is not None:  # asked for: an index with another is rebuilt
            recorded["seek_point_spacing"] = str(cls.spacing(options))
        return recorded

    @classmethod
    def spacing(cls, options: CompressionOptions) -> int:
        wanted = cls.default_spacing if options.seek_point_spacing is None else options.seek_point_spacing
        return max(MIN_SPACING, min(MAX_SPACING, int(wanted)))

    # --- the first pass records the block checksums ------------------------------------------
    def _decoding_reader(self) -> RandomAccessReader:
        """What decodes the first pass (this reader, or a child process's)."""
        return self

    def scan_reader(self) -> RandomAccessReader:
        if self._crcs is not None or self._payload_loader is not None:
            return self._decoding_reader()  # checksums known (a conversion of an indexed file)
        if self._crc_scan is None:
            decoding = self._decoding_reader()
            self._crc_scan = CrcScan(decoding, CrcCollector(), whole_crc32=self._checks_crc32_itself(decoding))
        return self._crc_scan

    def _checks_crc32_itself(self, decoding: RandomAccessReader) -> bool:
        """Whether the first pass must compute the stream's CRC-32 itself (see ``_verify_crc32``):
        its decoder may not have decoded each member from its start in one go."""
        return False

    def end_scan(self) -> None:
        self._crc_scan = None
        super().end_scan()

    def _complete_crcs(self) -> BlockCrcs:
        """The checksums of the whole stream: the rest of the first pass is read for them (all of
        it when no scan ran, e.g. a single compressed file)."""
        if self._crcs is None:
            scan = self.scan_reader()
            assert isinstance(scan, CrcScan)
            crcs = scan.read_to_end()
            if scan.crc32 is not None:
                self._verify_crc32(scan.crc32, crcs.size)
            self._crcs = crcs
            self._crc_scan = None
        return self._crcs

    def _verify_crc32(self, crc32: int, size: int) -> None:
        """Raise unless the stream's CRC-32 and size are those in the trailer of its (single)
        member; a file of several members is checked by one more pass with zlib."""
        trailer = self.raw_pread(max(0, self.compressed_size - 8), 8)
        if len(trailer) == 8 and struct.unpack("<II", trailer) == (crc32, size % (1 << 32)):
            return
        self._verify_with_zlib()  # (several members, zero padding, or damaged: zlib tells)

    def export_seek_points(self, writer: SeekPointWriter) -> None:
        crcs = self._complete_crcs()  # reads what the scan left (from a child process too)
        self._export_decoder_seek_points(writer)
        if crcs.size != self._size:
            raise CorruptDataError(
                f"{self.path}: the first pass read {crcs.size} decompressed bytes, the decoder counts {self._size}"
            )
        writer.put_seek_points(TABLE_NAME, crcs.parts())

    def _export_decoder_seek_points(self, writer: SeekPointWriter) -> None:
        super().export_seek_points(writer)

    def import_seek_points(self, index: SeekPointSource) -> None:
        super().import_seek_points(index)
        if self._crcs is None and self._payload_loader is not None:
            crcs = BlockCrcs.from_parts(index.seek_point_parts(TABLE_NAME))
            if crcs is None or crcs.size != self._size:
                raise InvalidIndexError(
                    f"{self.path}: the index holds no block checksums for the gzip data; rebuild it (--recreate-index)"
                )
            self._crcs = crcs

    # --- reads, checked -------------------------------------------------------------------------
    # Every byte returned after the first pass is checked against the block checksums:
    # - small reads are widened to whole blocks (from the span cache, or decoded), which are
    #   checked and kept in a small cache of checked blocks: a sequential reader of small files
    #   checks each block once, a random reader checks the one or two blocks it needs (checking
    #   whole spans when they are decoded cost 15% more time for random reads);
    # - large reads decode on to the end of their last block and check every block they touch;
    #   that last block is kept, so a sequential reader's next read starts where decoding stopped
    #   (``_ahead``) instead of decoding a block again.
    def pread(self, offset: int, size: int) -> bytes:
        crcs = self._crcs
        if crcs is None or size <= 0 or offset < 0:
            return super().pread(offset, size)
        start, end = crcs.span(offset, size)
        if start >= end:
            return b""
        block = crcs.block
        if end - start <= block:  # one block (the last one may be short)
            data = checked_blocks.BLOCKS.get(self._checked_token, start)
            if data is None:
                data = self._read_checked(crcs, start, end)
                checked_blocks.BLOCKS.put(self._checked_token, start, data)
        else:
            data = self._read_checked(crcs, start, end)
            if end % block == 0:  # where a sequential reader of small files continues
                checked_blocks.BLOCKS.put(self._checked_token, end - block, data[-block:])
        if start == offset and len(data) <= size:
            return data
        return data[offset - start : offset - start + size]

    def _read_checked(self, crcs: BlockCrcs, start: int, end: int) -> bytes:
        """Whole blocks ``[start, end)``, checked."""
        data = super().pread(start, end - start)
        self._expect(start, end, len(data))
        crcs.verify(self.path, start, data)
        return data

    def _expect(self, start: int, end: int, count: int) -> None:
        if count != end - start:
            raise CorruptDataError(
                f"{self.path}: the decompressed data ends at byte {start + count}, the index says "
                f"{self._crcs.size if self._crcs is not None else '?'}"
            )

    #: Whether large reads that continue no recent read go through the span cache, decoding from
    #: the seek point before them only up to their end (``_parallel``).
    random_reads_through_spans: ClassVar[bool] = False

    def preadinto(self, offset: int, view: memoryview) -> int:
        crcs = self._crcs
        if crcs is None or offset < 0:
            return super().preadinto(offset, view)
        # (The end a read asks for is noted before it is served: the kernel's read-ahead sends the
        # next piece of a file while this one is being decoded, and that one goes on from here.
        # Noted after, a `cat` of a 440 MB member through the mount took 2.3 s instead of 1.6.)
        parallel = self._parallel(offset, len(view))
        with self._recent_lock:
            recent = self._recent
            recent[offset + len(view)] = (recent.pop(offset, (0, False))[0] + 1, parallel)
            if len(recent) > ENDS_KEPT:
                recent.popitem(last=False)
        if not parallel:
            data = self.pread(offset, len(view))
            view[: len(data)] = data
            return len(data)
        return self._checked_parallel_into(crcs, offset, view)

    def _parallel(self, offset: int, size: int) -> bool:
        """Whether a read goes to the parallel decoders rather than the span cache. They decode
        whole chunks from a coarse seek point and read ahead in parallel: what a reader going
        through the archive in order wants, and waste for a random read, which through the span
        cache decodes from the seek point before it only up to its end. 1,000 random reads of
        whole members, in process: members of 20-200 KB 4.2 -> 2.5 s, of 512 KiB 8.0 -> 3.6 s;
        all members in order, those of 20-200 KB 1.5 -> 0.7 s (the small ones follow a stream
        of large ones instead of decoding the same data again through the cache)."""
        if not self.random_reads_through_spans:
            return size >= DIRECT_READ_MIN
        if size >= PARALLEL_READ_MIN or self._ahead_covers(offset):
            return True
        with self._recent_lock:
            recent = list(self._recent.items())
        large = size >= DIRECT_READ_MIN
        for end, (run, parallel) in recent:
            # A small read goes on with a stream the parallel decoders serve, not with one that
            # the span cache does (the small members of an archive read in order stay there),
            # unless it ends a run of STREAM_RUN exact continuations (a member read in pieces).
            if 0 <= offset - end <= SEQUENTIAL_GAP and (large or parallel or (end == offset and run + 1 >= STREAM_RUN)):
                return True
        return False

    def _ahead_covers(self, offset: int) -> bool:
        """Whether the last block of a recent parallel read holds ``offset`` (a stream to go on with)."""
        with self._ahead_lock:
            return any(start <= offset < start + len(data) for start, data in self._ahead.values())

    def _checked_parallel_into(self, crcs: BlockCrcs, offset: int, view: memoryview) -> int:
        try:
            return self._checked_into(crcs, offset, view)
        except CorruptDataError as exc:
            # The parallel decoder starts at a coarse seek point and decodes ahead of the read:
            # damage before or after the asked bytes, or the member's CRC-32 at its end that
            # damage elsewhere breaks, fails it. Block by block from the nearest seek points,
            # each block checked, only the damage the read touches fails it (found by fuzzing).
            logger.debug("%s: a large read failed (%s); reading it block by block", self.path, exc)
            return self._checked_blocks_into(crcs, offset, view)

    def _checked_blocks_into(self, crcs: BlockCrcs, offset: int, view: memoryview) -> int:
        size = min(len(view), crcs.size - offset)
        done = 0
        while done < size:
            data = self.pread(offset + done, min(size - done, crcs.block))
            if not data:
                break
            view[done : done + len(data)] = data
            done += len(data)
        return done

    def _checked_into(self, crcs: BlockCrcs, offset: int, view: memoryview) -> int:
        """A large read into ``view``, decoded by the parallel decoders straight into it, with
        the bytes around it that complete its first and last blocks."""
        size = min(len(view), crcs.size - offset)
        if size <= 0:
            return 0
        block = crcs.block
        done = 0
        ahead = self._take_ahead(offset)
        if ahead is not None:  # the start of this read was decoded (and checked) by the last one
            ahead_start, ahead_data = ahead
            done = min(size, ahead_start + len(ahead_data) - offset)
            view[:done] = ahead_data[offset - ahead_start : offset - ahead_start + done]
            if done == size:
                self._keep_ahead(ahead_start, ahead_data)
                return done
            begin = offset + done  # block-aligned: where the last read's decoding stopped
        else:
            begin = offset // block * block
        end = min(crcs.size, -(-(offset + size) // block) * block)
        body = view[done:size]
        with self._pool.acquire(begin, end=end) as slot:
            decoder = slot.instance
            with self.data_errors():
                if slot.position != begin:
                    decoder.seek(begin)
                head = read_fully(decoder, offset + done - begin) if offset + done > begin else b""
                got = 0
                while got < len(body):
                    count = decoder.readinto(body[got:])
                    if not count:
                        break
                    got += count
                tail = read_fully(decoder, end - (offset + size)) if got == len(body) and end > offset + size else b""
            slot.position = begin + len(head) + got + len(tail)
        self._expect(begin, end, len(head) + got + len(tail))
        crcs.verify_pieces(self.path, begin, [head, body, tail])
        last = max(begin, (end - 1) // block * block)
        self._keep_ahead(last, _slice_pieces(begin, [head, body, tail], last, end))
        return done + got

    def _take_ahead(self, offset: int) -> Optional[Tuple[int, bytes]]:
        with self._ahead_lock:
            for key, (start, data) in self._ahead.items():
                if start <= offset < start + len(data):
                    del self._ahead[key]
                    return start, data
        return None

    def _keep_ahead(self, start: int, data: bytes) -> None:
        with self._ahead_lock:
            self._ahead[start] = (start, data)
            while len(self._ahead) > AHEAD_KEPT:
                del self._ahead[next(iter(self._ahead))]

    def _check_complete(self, size: int) -> None:
        """Raise unless the stream of ``size`` decompressed bytes ends where the file does
        (indexed_gzip and rapidgzip's command-line tool read a truncated file without
        complaint). Cheap for a single member (its ISIZE) and for BGZF (its end-of-file
        block); any other file takes one more pass with zlib."""
        tail = self.raw_pread(max(0, self.compressed_size - len(BGZF_EOF)), len(BGZF_EOF))
        if len(tail) >= 4 and int.from_bytes(tail[-4:], "little") == size % (1 << 32):
            return  # ISIZE of the (last) member matches: the stream ends where it should
        if tail == BGZF_EOF:
            return
        self._verify_with_zlib()  # multi-member file or truncated: one more pass tells

    def truncation(self, failure: CorruptDataError) -> Optional[str]:
        # rapidgzip reports a truncated file as bad data in its decoder's words ("[IsalInflateWrapper]
        # ... Invalid lookback distance found!"): one streaming pass with zlib tells which it is
        # (only on this error path; it stops at the first bad byte).
        try:
            self._verify_with_zlib()
        except TruncatedArchiveError:
            return "the last member is incomplete"
        except CorruptDataError:
            return None  # bad data for zlib too
        return None

    def _verify_with_zlib(self) -> None:
        """One streaming pass over all members: raise if the last one is incomplete."""
        decompressor = zlib.decompressobj(wbits=31)
        in_member = False
        offset = 0
        with self.data_errors((zlib.error,)):
            while True:
                data = self.raw_pread(offset, 64 * 1024)  # small input: bounded output per call
                if not data:
                    break
                offset += len(data)
                while data:
                    if not in_member:
                        data = data.lstrip(b"\0")  # zero padding between or after members
                        if not data:
                            break
                        decompressor = zlib.decompressobj(wbits=31)
                        in_member = True
                    decompressor.decompress(data)
                    data = b""
                    if decompressor.eof:
                        data = decompressor.unused_data
                        in_member = False
        if in_member:
            raise TruncatedArchiveError(f"{self.path}: gzip data is truncated (the last member is incomplete)")

    def head(self, size: int) -> bytes:
        """Inflate just the first bytes with zlib (no decoder, no seek points)."""
        out = bytearray()
        offset = 0
        decompressor: Optional[Any] = None  # (None between members)
        with self.data_errors((zlib.error,)):
            while len(out) < size:
                data = self.raw_pread(offset, 64 * 1024)
                if not data:
                    break
                offset += len(data)
                while data and len(out) < size:
                    if decompressor is None:
                        # Zero padding between or after members; a member may also end right at
                        # the end of a chunk read (one ending at byte 65536 of the file ended the
                        # head there: found by fuzzing).
                        data = data.lstrip(b"\0")
                        if not data:
                            break
                        decompressor = zlib.decompressobj(wbits=31)
                    out += decompressor.decompress(data, size - len(out))
                    data = decompressor.unconsumed_tail
                    if decompressor.eof:  # next member (concatenated gzip files)
                        data = decompressor.unused_data
                        decompressor = None
        return bytes(out[:size])


class RapidgzipReader(_GzipReader):
    """Parallel decompression; seek points every ``seek_point_spacing`` bytes of *compressed* data
    (rapidgzip's ``chunk_size``), exported in gztool format (compressed windows)."""

    backend_name: ClassVar[str] = "rapidgzip"
    threads_call_python: ClassVar[bool] = True
    random_reads_through_spans: ClassVar[bool] = True
    #: A span-cache miss decodes one chunk: single-threaded decoders do it without the parallel
    #: decoder's speculative work on the following chunks (1,000 random reads from a 100,000-file
    #: .tar.gz through the mount: 20% less CPU, 5% faster). Scans and large reads keep all cores.
    span_decoder_threads: ClassVar[Optional[int]] = 1
    #: rapidgzip decodes only as many chunks ahead as it has threads. Through the mount, the
    #: reading thread stalls on round trips and copies, and with one thread per core the decoders
    #: run dry meanwhile; two per core keep the cores busy (2 vCPUs: sequential read of a 1 GB
    #: .tar.gz 2.65-3.03 -> 2.30-2.70 s, first mount of 100,000 files 2.27 -> 2.11 s; 4 per core
    #: gained nothing more). bzip2 got slower with more threads than cores and keeps one.
    default_oversubscription: ClassVar[int] = 2

    def explain_failure(self) -> Optional[str]:
        # (Without --gzip-backend rapidgzip, such a file goes to indexed_gzip when that is
        # installed: ``registry.open_compressed``.)
        if not gzip_zero_padded(self._plain):
            return None
        return (
            # (No count: the member's trailer may end in zero bytes too; 512 bytes of padding
            # were said to be 514.)
            "the file ends with zero bytes after the gzip data (padding, as tape tools write), "
            "which rapidgzip does not accept: mount it with --gzip-backend indexed_gzip"
        )

    #: A random read that misses the span cache decodes from one seek point to the next, so its
    #: cost is the spacing (1,000 random reads from a 100,000-file .tar.gz in-process: 1 MiB
    #: 2.1 s, 0.5 MiB 1.1 s, 384 KiB 0.93 s, 256 KiB 0.68 s) and the first pass pays per seek
    #: point (first mount 1.59-1.67 s at 0.5 MiB, 1.73-1.76 s at 384 KiB, 1.96 s at 256 KiB, with
    #: the child process). Large reads keep 1 MiB chunks (``PARALLEL_CHUNK``).
    default_spacing: ClassVar[int] = 384 * 1024
    #: ... unless the members are large: then reads are large too (they skip the span cache),
    #: and each seek point costs rapidgzip's first pass ~2.3 ms of CPU (first mount of a 1 GB
    #: .tar.gz of 512 KiB members: 3.6 s at 0.5 MiB, 2.5 s at 1 MiB on the Intel VM; on the AMD
    #: one, in-process: 2.85-3.84 s at 1 MiB, 2.27-2.47 s at 2 MiB, 2.04-2.12 s at 4 MiB, against
    #: random reads of whole members of 7.0, 8.6 and 9.9 ms; the peer's first mount 2.8-3.6 s).
    large_member_spacing: ClassVar[int] = 2 * PARALLEL_CHUNK
    large_member: ClassVar[int] = 512 * 1024
    #: ... and between the two, members of 128-512 KiB (a random read of one goes through the
    #: span cache, from the seek point before it up to its end: ``_parallel``): 1 MiB. 4,000
    #: members of 20-200 KB (JPEG-like, 310 MB), in process: first open 0.98-1.0 s at 2 MiB,
    #: 1.20-1.23 s at 1 MiB, 1.63 s at 0.5 MiB; 1,000 random reads 2.56, 1.58 and 1.09 s. A mount
    #: is made once, and a training job reads its files at random every epoch.
    mid_member_spacing: ClassVar[int] = PARALLEL_CHUNK
    mid_member: ClassVar[int] = 128 * 1024
    wants_member_size: ClassVar[bool] = True

    #: Files at least this large (compressed) get their first pass from a child process (see
    #: ``scan_process.py``). Below, starting the child costs more than it saves (a 4.5 MB
    #: .tar.gz: 0.11 s with it, 0.09 s without; 18 MB: 0.22 s with, 0.24 s without).
    scan_process_min: ClassVar[int] = 8 << 20

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._chunk_size = self.spacing(self.options)
        self._large_members = False
        self._process_scan: Optional[ProcessScan] = None
        #: Decodes span-cache misses only as far as they need (False: it cannot; see
        #: ``deflate_resume.py``), made from the seek points on the first miss.
        self._resumer: Union[None, bool, DeflateResumer] = None
        self._resumer_lock = threading.Lock()

    def _decode_span_start(self, start: int, end: int) -> Optional[bytes]:
        resumer = self._deflate_resumer()
        return resumer.decode(start, end) if resumer is not None else None

    def _span_starts_without_decoder(self) -> Optional[List[int]]:
        resumer = self._deflate_resumer()
        return resumer.starts() if resumer is not None else None

    def _deflate_resumer(self) -> Optional[DeflateResumer]:
        """The decoder of span-cache misses, made from the stored seek points when first asked
        for (None: there are none, or python-isal is missing)."""
        resumer = self._resumer
        if resumer is None:
            with self._resumer_lock:
                if self._resumer is None:
                    loader = self._payload_loader
                    made = None
                    try:
                        made = DeflateResumer.of_gztool_index(loader(), self.raw_pread) if loader is not None else None
                    except Exception as exc:  # noqa: BLE001 - the spans are decoded by rapidgzip as before
                        logger.debug("%s: no span decoding with ISA-L: %s", self.path, exc)
                    self._resumer = made if made is not None else False
                resumer = self._resumer
        return resumer if isinstance(resumer, DeflateResumer) else None

    def suggest_member_size(self, size: int) -> None:
        if size < self.mid_member:
            return
        self._large_members = True
        if self.options.seek_point_spacing is None:
            spacing = self.large_member_spacing if size >= self.large_member else self.mid_member_spacing
            logger.debug("%s: members of ~%d bytes: seek points every %d bytes", self.path, size, spacing)
            self._chunk_size = spacing
        if self.options.parallelization <= 0:
            # Two threads per core keep a scan fed that parses many small headers; a scan of
            # large members is all decoding, and more threads than cores only thrash (first
            # mount of the 1 GB .tar.gz: 3.16 s with 4 threads, 2.47 s with 2 on 2 vCPUs).
            self._scan_threads = self.options.threads()

    def _checks_crc32_itself(self, decoding: RandomAccessReader) -> bool:
        # A child process decodes the stream from its start to its end in one decoder, which
        # checks every member's CRC-32. Here, the scan's reads go to several decoders and the
        # span cache, and a decoder moved back and forth never checks it (damage inside an inner
        # .tar.gz was served: found by fuzzing).
        return decoding is self

    def _open_decoder(self, raw: Union[str, FdFile], threads: int) -> Any:
        import rapidgzip

        # No more threads than the stream has chunks, and one for a stream of two chunks or
        # less: threads there cost more to start and end than they decode in parallel. The
        # first pass over 1,000 inner .tar.gz of 340 kB in one tar: 3.7-4.4 s with 4 threads
        # each, 3.6 s with a thread a chunk, 3.4 s with one; 100 class .tar.gz of 680 kB in a
        # folder (two chunks each): 1.23-1.39, 1.31-1.36 and 1.03-1.10 s.
        chunks = -(-self.compressed_size // self._chunk_size)
        threads = 1 if chunks <= 2 else min(threads, chunks)
        return rapidgzip.RapidgzipFile(raw, parallelization=threads, chunk_size=self._chunk_size)

    # --- the first pass in a child process ------------------------------------------------------
    def _decoding_reader(self) -> RandomAccessReader:
        if self._process_scan is not None:
            return self._process_scan
        if (
            self._payload_loader is not None
            or self._size is not None
            or self.compressed_size < self.scan_process_min
            or self._large_members
            or not isinstance(self.library_source(), str)  # a window into an outer file
        ):
            # Large members: the scan parses few headers and hardly holds the GIL, while the
            # pipe would cost (first mount of a 1 GB .tar.gz of 512 KiB members: 2.7-2.9 s
            # with the child, 2.7-3.4 s without).
            return self
        threads = self.options.threads()
        if self.options.parallelization <= 0:
            # Parsing many small headers keeps this process busy on one core: leave it that one.
            threads = max(1, threads - 1)
        try:
            process = DecoderProcess(self.path, self._plain.fd, threads, self._chunk_size)
        except DecoderStartError as exc:
            logger.info("%s; decoding in this process", exc)
            return self
        self._process_scan = ProcessScan(process, self)
        return self._process_scan

    def compressed_progress(self) -> Optional[int]:
        scan = self._process_scan
        if scan is None or scan.process is None:
            return super().compressed_progress()
        return min(self.compressed_size, scan.process.compressed_read())

    def end_scan(self) -> None:
        super().end_scan()
        self._end_process_scan()

    def _end_process_scan(self) -> Optional[Tuple[int, bytes]]:
        """Finish the child's pass (None if there was none): its decompressed size and seek
        points, once it succeeded and the stream is known to be complete."""
        scan, self._process_scan = self._process_scan, None
        if scan is None:
            return None
        try:
            if scan.process is None:
                return None
            try:
                size, payload = scan.finish()
            except CorruptDataError:
                # The child's messages are its decoder's internals, and it reports a truncated
                # stream as bad data: one pass with zlib says which it is, in zlib's words.
                self._verify_with_zlib()
                raise
        finally:
            scan.close()
        self._check_complete(size)
        return size, payload

    def _export_decoder_seek_points(self, writer: SeekPointWriter) -> None:
        done = self._end_process_scan()
        if done is None:
            super()._export_decoder_seek_points(writer)
            return
        size, payload = done
        self._use_seek_points(size, lambda: payload)
        header = {"size": size, "compressed_size": self.compressed_size}
        writer.put_seek_points(self.backend_name, pack_seek_points(header, payload))
        logger.debug("%s: stored %d bytes of seek points made by the child process", self.path, len(payload))

    def close(self) -> None:
        scan, self._process_scan = self._process_scan, None
        checked_blocks.BLOCKS.drop(self._checked_token)
        try:
            if scan is not None:
                scan.close()
        finally:
            super().close()

    def _load_seek_points(self, decoder: Any, payload: bytes) -> None:
        decoder.import_index(io.BytesIO(payload))

    def _coarse_seek_points(self, payload: bytes) -> Optional[bytes]:
        thinned = thin_gztool_index(payload, PARALLEL_CHUNK)
        return thinned if len(thinned) < len(payload) else None

    def _span_starts(self, decoder: Any) -> Optional[List[int]]:
        return sorted(set(decoder.block_offsets().values()))

    def _finish(self, decoder: Any) -> int:
        size = int(decoder.seek(0, io.SEEK_END))  # decompresses (and CRC-checks) the rest
        offsets = decoder.block_offsets()
        end = (max(offsets) + 7) // 8 if offsets else 0
        if end < self.compressed_size:
            # rapidgzip's offsets end at its last whole chunk: "stops at byte 0" for a file cut
            # inside its first one. zlib says what happened, as for the other backend.
            self._verify_with_zlib()
            raise TruncatedArchiveError(
                f"{self.path}: gzip data is truncated (the deflate stream stops at byte {end} of "
                f"{self.compressed_size})"
            )
        return size

    def _export(self, decoder: Any) -> bytes:
        import rapidgzip

        buffer = io.BytesIO()
        decoder.export_index(buffer, rapidgzip.IndexFormat.GZTOOL)
        return buffer.getvalue()


class IndexedGzipReader(_GzipReader):
    """Single-threaded zran; seek points every ``seek_point_spacing`` bytes of decompressed data
    (32 KiB window each, stored uncompressed). The full index is built -- and every CRC
    verified -- when the first decoder is created."""

    backend_name: ClassVar[str] = "indexed_gzip"
    finish_on_create: ClassVar[bool] = True
    max_instances: ClassVar[int] = 2  # each holds the whole (uncompressed) window table

    def _open_decoder(self, raw: Union[str, FdFile], threads: int) -> Any:
        import indexed_gzip

        source: Dict[str, Any] = {"filename": raw} if isinstance(raw, str) else {"fileobj": raw}
        return indexed_gzip.IndexedGzipFile(**source, spacing=self.spacing(self.options), auto_build=True)

    def _load_seek_points(self, decoder: Any, payload: bytes) -> None:
        decoder.import_index(fileobj=io.BytesIO(payload))

    def _span_starts(self, decoder: Any) -> Optional[List[int]]:
        return [int(uncompressed) for uncompressed, _compressed in decoder.seek_points()]

    def _export(self, decoder: Any) -> bytes:
        buffer = io.BytesIO()
        decoder.export_index(fileobj=buffer)
        return buffer.getvalue()

    def _finish(self, decoder: Any) -> int:
        decoder.build_full_index()
        size = int(decoder.seek(0, io.SEEK_END))
        self._check_complete(size)
        return size
