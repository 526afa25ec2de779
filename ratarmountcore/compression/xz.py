"""xz: one seek point per block, found with python-xz's parsers of the stream footer and index.

Reading the index of every stream costs a few small reads at the end of the file; the resulting
block table is stored in the SQLite index like zstd's frame table. A block is decoded on its own
by wrapping it in a synthetic one-block stream (python-xz's ``create_xz_header`` and
``create_xz_index_footer``) for the standard ``lzma`` module, which then also verifies the block's
check (CRC32/CRC64/SHA-256) and sizes. Files made by single-threaded ``xz`` are one block: they
work, but seeking decompresses from the start (one warning); ``xz -T0`` makes multi-block files.
"""

from __future__ import annotations

import lzma
import mmap
from typing import Any, ClassVar, List, Optional, Tuple

from ..errors import CorruptDataError, TruncatedArchiveError
from ..formats import FormatId
from .framed import FrameData, FramedReader, FrameStream, FrameTable

#: Output per decompress call when a block is decoded whole.
DECODE_STEP = 1 << 20


def _xz_errors() -> Tuple[type, ...]:
    from xz.common import XZError

    return (lzma.LZMAError, XZError)


def _round_up4(value: int) -> int:
    return (value + 3) & ~3


class _LzmaBlockStream(FrameStream):
    """Streams one block through ``lzma`` with bounded output per call."""

    def __init__(self, header: bytes, raw: Any, footer: bytes) -> None:
        self._inputs: List[bytes] = [header]
        self._raw = raw
        self._footer = footer
        self._decompressor = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)

    def _next_input(self) -> bytes:
        if self._inputs:
            return self._inputs.pop(0)
        if self._raw is not None:
            data = self._raw.read(1 << 20)
            if data:
                return data  # type: ignore[no-any-return]
            self._raw = None
            return self._footer
        return b""

    def read(self, size: int) -> bytes:
        out = bytearray()
        decompressor = self._decompressor
        while len(out) < size and not decompressor.eof:
            data = self._next_input() if decompressor.needs_input else b""
            if decompressor.needs_input and not data:
                raise lzma.LZMAError("xz block ends unexpectedly")
            out += decompressor.decompress(data, size - len(out))
        return bytes(out)


class XzReader(FramedReader):
    backend_name: ClassVar[str] = "python_xz"
    format_name: ClassVar[str] = "xz"
    format_id: ClassVar[FormatId] = FormatId.XZ
    multi_frame_hint: ClassVar[str] = (
        "Recompress with `xz --block-size=4MiB` (`xz -T0` alone writes blocks of 24 MiB and more), or "
        "convert it once with `ratarmount-convert ARCHIVE OUT.tar.zst` (4 MiB frames, index included)."
    )
    decode_mib_per_second: ClassVar[float] = 30.0

    def data_errors(self, extra: Tuple[type, ...] = ()) -> Any:
        return super().data_errors((*extra, *_xz_errors()))

    def _before_padding(self, end: int) -> int:
        """Where the stream padding (null bytes, in fours) before ``end`` begins, read 64 KiB at a
        time (four bytes a read cost 0.35 s per MiB of padding: found by fuzzing)."""
        while end >= 4:
            start = max(end - 65536, end % 4)
            data = self.raw_pread(start, end - start)
            kept = len(data.rstrip(b"\0"))
            end = start + kept + (len(data) - kept) % 4  # (only whole fours are padding)
            if kept or len(data) < 65536:
                break
        return end

    def _build_table(self) -> FrameTable:
        from xz.common import parse_xz_footer, parse_xz_header, parse_xz_index

        streams: List[List[Tuple[int, int, int, int]]] = []  # (offset, unpadded, uncompressed, check)
        end = self.compressed_size
        while end > 0:
            end = self._before_padding(end)
            if end == 0:
                break
            if end < 24:
                raise TruncatedArchiveError(f"{self.path}: xz data is truncated or corrupt (no stream footer)")
            footer = self.raw_pread(end - 12, 12)
            if footer[10:12] != b"YZ":  # the footer magic
                raise TruncatedArchiveError(f"{self.path}: xz data is truncated (no stream footer at the end)")
            check, backward_size = parse_xz_footer(footer)
            index_start = end - 12 - backward_size
            records = parse_xz_index(self.raw_pread(index_start, backward_size))
            blocks_start = index_start - sum(_round_up4(unpadded) for unpadded, _ in records)
            stream_start = blocks_start - 12
            if stream_start < 0 or parse_xz_header(self.raw_pread(stream_start, 12)) != check:
                raise CorruptDataError(f"{self.path}: corrupt xz stream ending at byte {end}")
            blocks = []
            offset = blocks_start
            for unpadded, uncompressed in records:
                blocks.append((offset, unpadded, uncompressed, check))
                offset += _round_up4(unpadded)
            streams.append(blocks)
            end = stream_start
        table = FrameTable()
        for blocks in reversed(streams):
            for offset, unpadded, uncompressed, check in blocks:
                table.append(offset, unpadded, uncompressed, check)
        return table

    def _wrap(self, frame: int, table: FrameTable) -> Tuple[bytes, bytes]:
        from xz.common import create_xz_header, create_xz_index_footer

        check = table.aux[frame]
        footer = create_xz_index_footer(check, [(table.comp_sizes[frame], table.decomp_sizes[frame])])
        return create_xz_header(check), footer

    def _self_checked(self, frame: int, table: FrameTable) -> bool:
        return table.aux[frame] != 0  # the stream's check type; 0: none

    def _decode_frame(self, frame: int, table: FrameTable) -> FrameData:
        # Both sides go in steps: the compressed block is read and fed 1 MiB at a time, and the
        # output lands straight in a buffer of the indexed size. Whole-block input and a one-shot
        # decompress held the block's compressed bytes three times (read, joined with the
        # stream header, copied into the decoder) and its output twice: ~110 MB in flight for
        # one of the 24 MiB blocks that multi-threaded xz writes, twice with decode-ahead.
        # The output is an anonymous mapping of its own, so that its memory goes back to the OS
        # when the frame leaves the cache, whatever the process's malloc keeps.
        header, footer = self._wrap(frame, table)
        offset = table.comp_offsets[frame]
        end = offset + _round_up4(table.comp_sizes[frame])
        size = table.decomp_sizes[frame]
        out = mmap.mmap(-1, max(size, 1))
        view = memoryview(out)
        decompressor = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
        filled = 0
        data = header
        footer_fed = False
        try:
            while not decompressor.eof:
                if not data and decompressor.needs_input:
                    if offset < end:
                        data = self.raw_pread(offset, min(DECODE_STEP, end - offset))
                        if not data:
                            raise TruncatedArchiveError(f"{self.path}: xz data is truncated (block {frame})")
                        offset += len(data)
                    elif not footer_fed:
                        data, footer_fed = footer, True
                    else:
                        raise CorruptDataError(f"{self.path}: corrupt xz data (block {frame} is incomplete)")
                piece = decompressor.decompress(data, min(DECODE_STEP, size - filled + 1))
                data = b""
                if len(piece) > size - filled:
                    raise CorruptDataError(f"{self.path}: corrupt xz data (block {frame} is longer than indexed)")
                view[filled : filled + len(piece)] = piece
                filled += len(piece)
        finally:
            view.release()
        return out if filled == size else out[:filled]  # a short block fails the caller's size check

    def _open_stream(self, frame: int, table: FrameTable) -> FrameStream:
        header, footer = self._wrap(frame, table)
        offset = table.comp_offsets[frame]
        raw = self.open_raw(offset, offset + _round_up4(table.comp_sizes[frame]))
        return _LzmaBlockStream(header, raw, footer)

    def head(self, size: int) -> bytes:
        out = bytearray()
        offset = 0
        data = b""
        decompressor: Optional[lzma.LZMADecompressor] = None  # (None between streams)
        with self.data_errors():
            while len(out) < size:
                if decompressor is None:
                    data = data.lstrip(b"\0")  # stream padding
                if not data and (decompressor is None or decompressor.needs_input):
                    data = self.raw_pread(offset, 64 * 1024)
                    if not data:
                        break
                    offset += len(data)
                    continue
                if decompressor is None:
                    # The next stream: a file of several (``xz a; xz b``) holds them all (a first
                    # stream shorter than a tar header was taken for the whole file: found by
                    # fuzzing).
                    decompressor = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
                out += decompressor.decompress(data, size - len(out))
                data = b""
                if decompressor.eof:
                    data = decompressor.unused_data
                    decompressor = None
        return bytes(out[:size])
