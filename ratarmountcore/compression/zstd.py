"""zstd with python-zstandard: one seek point per frame.

The frame table is found by walking frame and block headers (a few bytes per 128 KiB block, no
decompression) -- except for frames whose header lacks the content size, which are decompressed
once to measure them. Skippable frames (e.g. the seek table of the "seekable zstd" format) are
skipped. Multi-frame files (``ratarmount-convert``, ``pzstd``) give fast random access; a file
that is one huge frame (plain ``zstd``) still works, but reaching a late offset decompresses the
frame from its start, and one warning says so.

Integrity: frames written with a checksum (``zstd`` does by default) are verified on decode;
cacheable frames are verified before any of their bytes is returned.
"""

from __future__ import annotations

import mmap
import threading
from typing import Any, ClassVar, Optional, Tuple

from ..errors import CorruptDataError, TruncatedArchiveError
from ..formats import FormatId
from .framed import FrameData, FramedReader, FrameStream, FrameTable

ZSTD_MAGIC = 0xFD2FB528
SKIPPABLE_MASK = 0xFFFFFFF0
SKIPPABLE_MAGIC = 0x184D2A50
_DICT_ID_BYTES = (0, 1, 2, 4)
_FCS_BYTES = (0, 2, 4, 8)
#: Output per step when a frame is measured.
STEP = 4 << 20
#: Decoded bytes per step when a stream skips forward.
SKIP_STEP = 1 << 20
#: The largest window a frame may ask for: the format's limit on 64-bit machines (``zstd --long=31``).
#: python-zstandard refuses frames of windows above 128 MiB by default ("Frame requires too much
#: memory for decoding"); a ``tar -I 'zstd --long=31'`` archive is intact, and ``zstd -d`` reads it
#: when told so (found by fuzzing). A decoder holds at most the window, and for a frame of known
#: size at most the frame.
MAX_WINDOW = 1 << 31


def _new_decompressor() -> Any:
    """A python-zstandard decompressor that takes windows up to ``MAX_WINDOW``."""
    import zstandard

    return zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW)


#: The most a zstd block decompresses to (the format's Block_Maximum_Size).
BLOCK_MAX = 128 * 1024


def _zstd_error() -> Tuple[type, ...]:
    import zstandard

    return (zstandard.ZstdError,)


def parse_frame_header(head: bytes) -> Tuple[int, Optional[int], bool]:
    """(header size, content size or None, has checksum) of the zstd frame starting ``head``."""
    if len(head) < 6:
        raise ValueError("frame header is cut off")
    descriptor = head[4]
    fcs_flag = descriptor >> 6
    single_segment = bool(descriptor & 0x20)
    if descriptor & 0x08:
        raise ValueError("reserved bit set in frame header")
    has_checksum = bool(descriptor & 0x04)
    position = 5 + (0 if single_segment else 1) + _DICT_ID_BYTES[descriptor & 0x03]
    fcs_bytes = _FCS_BYTES[fcs_flag] if (fcs_flag or not single_segment) else 1
    if len(head) < position + fcs_bytes:
        raise ValueError("frame header is cut off")
    content_size: Optional[int] = None
    if fcs_bytes:
        content_size = int.from_bytes(head[position : position + fcs_bytes], "little")
        if fcs_bytes == 2:
            content_size += 256
    return position + fcs_bytes, content_size, has_checksum


class _ZstdFrameStream(FrameStream):
    def __init__(self, raw: Any) -> None:
        self._reader = _new_decompressor().stream_reader(
            raw, read_size=1 << 20, read_across_frames=False, closefd=False
        )
        self._scratch: Optional[memoryview] = None

    def read(self, size: int) -> bytes:
        return self._reader.read(size)  # type: ignore[no-any-return]

    def readinto(self, view: memoryview) -> int:
        return self._reader.readinto(view)  # type: ignore[no-any-return]

    def skip(self, size: int) -> int:
        # Into one reused buffer: a fresh 1 MiB object per step is freed at the top of the heap,
        # given back to the OS and faulted in again by the next (14% of the daemon's CPU for
        # random reads in a single-frame .tar.zst).
        scratch = self._scratch
        if scratch is None:
            scratch = self._scratch = memoryview(bytearray(SKIP_STEP))
        done = 0
        while done < size:
            got = self._reader.readinto(scratch[: min(size - done, SKIP_STEP)])
            if not got:
                break
            done += got
        return done

    def close(self) -> None:
        self._reader.close()


class ZstdReader(FramedReader):
    backend_name: ClassVar[str] = "zstandard"
    format_name: ClassVar[str] = "zstd"
    format_id: ClassVar[FormatId] = FormatId.ZSTD
    multi_frame_hint: ClassVar[str] = (
        "For fast random access convert it once with `ratarmount-convert ARCHIVE OUT.tar.zst` "
        "(independent 4 MiB frames, index included) or compress with `pzstd`."
    )
    decode_mib_per_second: ClassVar[float] = 500.0

    _local = threading.local()

    def data_errors(self, extra: Tuple[type, ...] = ()) -> Any:
        return super().data_errors((*extra, *_zstd_error()))

    # --- frame table --------------------------------------------------------------------------
    def _build_table(self) -> FrameTable:
        table = FrameTable()
        position = 0
        end_of_file = self.compressed_size
        while position < end_of_file:
            head = self.raw_pread(position, 18)
            if len(head) < 8:
                if not head.strip(b"\0"):
                    break  # zero padding at the end
                raise TruncatedArchiveError(f"{self.path}: zstd data is truncated at byte {position}")
            magic = int.from_bytes(head[:4], "little")
            if magic & SKIPPABLE_MASK == SKIPPABLE_MAGIC:
                frame_end = position + 8 + int.from_bytes(head[4:8], "little")
                if frame_end > end_of_file:  # (``zstd -d``: "premature end")
                    where = f"the skippable frame at byte {position} ends after the file"
                    raise TruncatedArchiveError(f"{self.path}: zstd data is truncated ({where})")
                position = frame_end
                continue
            if magic != ZSTD_MAGIC:
                raise CorruptDataError(f"{self.path}: corrupt zstd data (no frame starts at byte {position})")
            try:
                header_size, content_size, has_checksum = parse_frame_header(head)
            except ValueError as exc:
                raise CorruptDataError(f"{self.path}: corrupt zstd frame header at byte {position} ({exc})") from None
            frame_end, blocks = self._walk_blocks(position + header_size)
            frame_end += 4 if has_checksum else 0
            if frame_end > end_of_file:
                raise TruncatedArchiveError(
                    f"{self.path}: zstd data is truncated (the frame at byte {position} ends after the file)"
                )
            if content_size is None and frame_end == end_of_file and frame_end - position > self.whole_frame_limit:
                # The last frame, too large to cache (so it will be streamed anyway): instead of
                # decoding it once just to measure it, give it an upper bound (every block holds
                # at most 128 KiB) that the first stream to reach its end replaces by its size.
                # `tar -I zstd -cf` writes such files (zstd reading a pipe): their first mount
                # decoded everything twice.
                table.append(position, frame_end - position, max(1, blocks) * BLOCK_MAX, int(has_checksum))
                table.open_end = True
                break
            if content_size is None:
                content_size = self._measure_frame(position, frame_end - position, keep=not table)
            table.append(position, frame_end - position, content_size, int(has_checksum))
            position = frame_end
        return table

    def _self_checked(self, frame: int, table: FrameTable) -> bool:
        return table.aux[frame] == 1  # the frame header's Content_Checksum_flag (see _build_table)

    def _walk_blocks(self, position: int) -> Tuple[int, int]:
        """Offset after the last block of the frame whose first block header is at ``position``,
        and the number of blocks."""
        blocks = 0
        block: Optional[int] = None  # (where the last block read starts)
        while True:
            header = self.raw_pread(position, 3)
            if len(header) < 3:
                # Positions said are in the file: a block's size took ``position`` past its end,
                # and "inside a block at byte 363282" of a 300,000-byte file named none.
                if position < self.compressed_size:
                    where = f"inside the block header at byte {position}"
                elif block is None:
                    where = "the file ends inside the frame header"
                elif position > self.compressed_size:
                    where = f"the block at byte {block} ends after the file"
                else:
                    where = f"the file ends after the block at byte {block}, before the frame's last block"
                raise TruncatedArchiveError(f"{self.path}: zstd data is truncated ({where})")
            block = position
            value = int.from_bytes(header, "little")
            last, block_type, block_size = value & 1, (value >> 1) & 3, value >> 3
            if block_type == 3 or block_size > BLOCK_MAX:
                # (No block is larger: a damaged header that sent the walk past the file's end
                # was called truncated.)
                raise CorruptDataError(f"{self.path}: corrupt zstd block header at byte {position}")
            position += 3 + (1 if block_type == 1 else block_size)
            blocks += 1
            if last:
                return position, blocks

    def _measure_frame(self, offset: int, length: int, keep: bool) -> int:
        """Decompress a frame without a content size once (verifying it) to learn its size.

        With ``keep``, the first frame's output is kept when it turns out small enough to be
        cached whole: the first mount's scan starts there and need not decode it again (plain
        ``zstd`` from a pipe writes one such frame; 10,000-file .tar.zst: first mount -12%).
        The output goes straight into an anonymous mapping that is trimmed or dropped at the end.
        """
        stream = _ZstdFrameStream(self.open_raw(offset, offset + length))
        limit = self.whole_frame_limit
        out: Optional[mmap.mmap] = mmap.mmap(-1, limit + 1) if keep else None
        scratch = memoryview(bytearray(0 if keep else STEP))
        total = 0
        try:
            with self.data_errors():
                while True:
                    if out is not None and total > limit:
                        out.close()  # too large to cache: count the rest only
                        out, scratch = None, memoryview(bytearray(STEP))
                    if out is not None:
                        with memoryview(out) as view:
                            got = stream.readinto(view[total : min(total + STEP, limit + 1)])
                    else:
                        got = stream.readinto(scratch)
                    if not got:
                        break
                    total += got
        finally:
            stream.close()  # on an error, the mapping goes with the last reference to it
        if out is not None and total > 0:
            out.resize(total)
            self.seed_frame(0, out)
        elif out is not None:
            out.close()
        return total

    # --- decoding -----------------------------------------------------------------------------
    def _decompressor(self) -> Any:
        decompressor = getattr(self._local, "decompressor", None)
        if decompressor is None:
            decompressor = self._local.decompressor = _new_decompressor()
        return decompressor

    def _decode_frame(self, frame: int, table: FrameTable) -> FrameData:
        data = self.raw_pread(table.comp_offsets[frame], table.comp_sizes[frame])
        if len(data) != table.comp_sizes[frame]:
            raise TruncatedArchiveError(f"{self.path}: zstd data is truncated (frame {frame})")
        if table.aux[frame] == 1 and not data[4] & 0x04:
            # The decoder checks what the header says: a frame recorded as checking itself (so
            # no CRC-32C table of ours) whose Content_Checksum_flag was cleared since checks nothing.
            raise CorruptDataError(
                f"{self.path}: corrupt zstd frame header at byte {table.comp_offsets[frame]} "
                "(its checksum flag changed since the index was built)"
            )
        return self._decompressor().decompress(data, max_output_size=table.decomp_sizes[frame])  # type: ignore[no-any-return]

    def _open_stream(self, frame: int, table: FrameTable) -> FrameStream:
        offset = table.comp_offsets[frame]
        return _ZstdFrameStream(self.open_raw(offset, offset + table.comp_sizes[frame]))

    def head(self, size: int) -> bytes:
        raw: Any = self.open_raw()
        reader = _new_decompressor().stream_reader(raw, read_across_frames=True, closefd=False)
        pieces = []
        remaining = size
        with self.data_errors():
            while remaining > 0:
                data = reader.read(remaining)
                if not data:
                    break
                pieces.append(data)
                remaining -= len(data)
        reader.close()
        return b"".join(pieces)
