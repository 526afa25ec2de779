"""bzip2: ``rapidgzip.IndexedBzip2File`` (parallel block decoding).

Seek points are the natural bzip2 block boundaries (``block_offsets()``: compressed bit offset
-> decompressed byte offset), so ``seek_point_spacing`` does not apply. Every block carries a
CRC32 that the decoder checks whenever it decodes the block, so corrupt data fails the reads
that touch it (and the first mount, which decodes everything).
"""

from __future__ import annotations

import bz2
import io
import struct
from typing import Any, ClassVar, Dict, List, Optional, Union

from ..formats import FormatId
from .base import FdFile
from .pooled import PooledReader


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

    def _open_decoder(self, raw: Union[str, FdFile], threads: int) -> Any:
        import rapidgzip

        return rapidgzip.IndexedBzip2File(raw, parallelization=threads)

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
                if decompressor.needs_input:
                    chunk = self.raw_pread(offset, 64 * 1024)
                    if not chunk:
                        break
                    offset += len(chunk)
                else:
                    chunk = b""
                out += decompressor.decompress(chunk, size - len(out))
                if decompressor.eof:
                    rest = decompressor.unused_data
                    if not rest.strip(b"\0"):
                        break
                    decompressor = bz2.BZ2Decompressor()
                    out += decompressor.decompress(rest, max(0, size - len(out)))
        return bytes(out[:size])
