"""CRC-32C of every 16 KiB block of a gzip stream's decompressed data.

gzip carries one CRC-32 per member, which only a decode from the member's start can check, and
random reads start at seek points in the middle. Deflate's own structure catches some damage
there, not all: a bit flipped after the index was built (bit rot on a long-lived dataset) made
reads return wrong bytes without an error (12 single-bit flips in a 6 MB .tar.gz: 122 members
served wrong, measured before this module existed). So the first pass, which decodes the whole
stream anyway, also records the CRC-32C of each ``BLOCK`` bytes of decompressed data, and every
later read is widened to whole blocks and checked against them before a byte is returned.
CRC-32C (Castagnoli) because the ``crc32c`` package computes it with the CPU's instruction:
8.6 GB/s here against 2.9 GB/s for ``zlib.crc32``, which cost sequential reads of a large
.tar.gz through the mount a quarter of their speed.

Blocks are aligned to the decompressed stream, not to seek points: a decoder can start at the
seek point before any block and discard what precedes it, so every block is checkable however
the seek points fall. The table costs 4 bytes per 16 KiB (256 KiB of index per GiB of data; a seek point's window
alone is 32 KiB).
"""

from __future__ import annotations

import array
import logging
import os
import zlib
from typing import Callable, List, Optional, Sequence, Union

from ..errors import CorruptDataError
from ..io.readers import RandomAccessReader
from .base import pack_seek_points, unpack_seek_points

logger = logging.getLogger(__name__)

#: 16 KiB: reads touching a block that straddles a seek point need the spans on both sides of
#: it (4% of small random reads with 384 KiB spans); 4 bytes per 16 KiB of data.
BLOCK = 16 * 1024
#: Name of the table's rows in the index's ``seek_points``.
TABLE_NAME = "gzip-crc32c"
#: Pieces the first pass reads to fill a gap (data the scan skipped) or to reach the end.
_PIECE = 1024 * 1024


Buffer = Union[bytes, bytearray, memoryview]


def crc32_function() -> Callable[[Buffer, int], int]:
    """gzip's CRC-32: ISA-L's (python-isal, 6.7 GB/s on the AMD VM) when installed, else
    zlib's (2.0 GB/s). The first pass of a 1 GB .tar.gz spent 0.63 s in ``zlib.crc32``.
    Imported on first use: a mount of a .tar.zst, .tar.xz or .tar.bz2 never needs it (the
    import took 2.5 ms and 0.5 MiB resident of every mount)."""
    try:
        from isal import isal_zlib
    except ImportError:
        return zlib.crc32
    return isal_zlib.crc32  # type: ignore[no-any-return]


_crc_function: Optional[Callable[[Buffer, int], int]] = None


def crc32c_function() -> Callable[[Buffer, int], int]:
    """``crc32c.crc32c``, loaded on first use (see ``_load_crc32c``)."""
    global _crc_function
    if _crc_function is None:
        _crc_function = _load_crc32c()
    return _crc_function


def _load_crc32c() -> Callable[[Buffer, int], int]:
    """The crc32c package's C function, loaded from its extension module without running the
    package's ``__init__``, which imports ``importlib.metadata`` (and with it email, socket, ...)
    only to know its own version: 19-24 ms of every first mount of a compressed archive and of
    the first checked read of every mount. Any other layout of the package: imported as usual."""
    import importlib.machinery
    import importlib.util

    try:
        package = importlib.util.find_spec("crc32c")  # (finds it without running it)
        folders = list(package.submodule_search_locations or ()) if package is not None else []
        for folder in folders:
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                path = os.path.join(folder, "_crc32c" + suffix)
                if os.path.isfile(path):
                    loader = importlib.machinery.ExtensionFileLoader("crc32c._crc32c", path)
                    spec = importlib.util.spec_from_loader("crc32c._crc32c", loader)
                    if spec is None:
                        continue
                    module = importlib.util.module_from_spec(spec)
                    loader.exec_module(module)
                    function = module.crc32c
                    if function(b"123456789") == 0xE3069283:  # the CRC-32C check value
                        return function  # type: ignore[no-any-return]
    except (ImportError, OSError, AttributeError, ValueError) as exc:
        logger.debug("crc32c's extension module not loaded directly: %s", exc)
    from crc32c import crc32c

    return crc32c  # type: ignore[no-any-return]


class BlockCrcs:
    """The table of one stream of ``size`` decompressed bytes (the last block may be short)."""

    def __init__(self, crcs: "array.array[int]", size: int, block: int = BLOCK) -> None:
        if len(crcs) != -(-size // block):
            raise ValueError(f"{len(crcs)} block checksums for {size} bytes")
        self.crcs = crcs
        self.size = size
        self.block = block

    def span(self, offset: int, size: int) -> "tuple[int, int]":
        """``[offset, offset + size)`` widened to whole blocks (clipped to the stream)."""
        block = self.block
        end = min(self.size, offset + size)
        return offset // block * block, min(self.size, -(-end // block) * block)

    def verify(self, path: str, start: int, data: Buffer) -> None:
        """Raise ``CorruptDataError`` unless ``data`` (whole blocks from ``start``) matches."""
        self.verify_pieces(path, start, [data])

    def verify_pieces(self, path: str, start: int, pieces: Sequence[Buffer], what: str = "decompressed data") -> None:
        """Like ``verify`` for data given as consecutive pieces (blocks may span pieces);
        ``what`` names the data in the error."""
        block = self.block
        if start % block:
            raise ValueError("data must start at a block boundary")
        collector = CrcCollector(block)
        for piece in pieces:
            collector.feed(piece)
        end = start + collector.position
        if end % block and end != self.size:
            raise ValueError("data does not end at a block boundary")
        first = start // block
        for number, crc in enumerate(collector.checksums(), start=first):
            if crc != self.crcs[number]:
                raise CorruptDataError(
                    f"{path}: {what} at offset {number * block} does not match the checksum "
                    "recorded when the index was built (the file was damaged since)"
                )

    def parts(self) -> List[bytes]:
        return pack_seek_points({"size": self.size, "block": self.block}, self.crcs.tobytes())

    @classmethod
    def from_parts(cls, parts: Sequence[bytes]) -> Optional["BlockCrcs"]:
        found = unpack_seek_points(list(parts))
        if found is None:
            return None
        header, payload = found
        crcs = array.array("I")
        crcs.frombytes(payload)
        return cls(crcs, int(header["size"]), int(header["block"]))


class CrcCollector:
    """Builds the table from the decompressed stream, fed in order."""

    def __init__(self, block: int = BLOCK) -> None:
        self.block = block
        self.position = 0
        self._crcs: "array.array[int]" = array.array("I")
        self._crc = 0
        self._filled = 0
        self._function = crc32c_function()

    def feed(self, data: Buffer) -> None:
        view = memoryview(data).cast("B")
        self.position += len(view)
        block = self.block
        crc, filled, crcs = self._crc, self._filled, self._crcs  # locals: large reads go through here
        function = self._function
        while view:
            take = min(len(view), block - filled)
            crc = function(view[:take], crc)
            filled += take
            view = view[take:]
            if filled == block:
                crcs.append(crc)
                crc = filled = 0
        self._crc, self._filled = crc, filled

    def checksums(self) -> "array.array[int]":
        """One per block fed so far, the last one possibly short."""
        crcs = array.array("I", self._crcs)
        if self._filled:
            crcs.append(self._crc)
        return crcs

    def table(self) -> BlockCrcs:
        return BlockCrcs(self.checksums(), self.position, self.block)


class CrcScan:
    """The first pass's reader with the table built on the way: every decompressed byte goes
    through the collector once, in order, including the data a scan skips (read instead).
    ``whole_crc32``: also the CRC-32 of the whole stream (``crc32_function``), as gzip's trailer has it,
    for a pass whose decoder may not check it itself."""

    def __init__(self, inner: RandomAccessReader, collector: CrcCollector, whole_crc32: bool = False) -> None:
        self.inner = inner
        self.collector = collector
        self.ended = False
        self.crc32: Optional[int] = 0 if whole_crc32 else None
        self._crc32 = crc32_function() if whole_crc32 else zlib.crc32

    def pread(self, offset: int, size: int) -> bytes:
        collector = self.collector
        while collector.position < offset and not self.ended:
            self._feed_next(min(_PIECE, offset - collector.position))
        data = self.inner.pread(offset, size)
        start = collector.position - offset
        if 0 <= start < len(data):
            self._feed(memoryview(data)[start:] if start else data)
        return data

    def _feed_next(self, size: int) -> None:
        piece = self.inner.pread(self.collector.position, size)
        if not piece:
            self.ended = True
            return
        self._feed(piece)

    def _feed(self, data: Buffer) -> None:
        self.collector.feed(data)
        if self.crc32 is not None:
            self.crc32 = self._crc32(data, self.crc32)

    @property
    def size(self) -> int:
        """The decompressed size, learnt by reading (and checksumming) the rest of the stream:
        the tar scan asks for it only at an archive that ends inside a member."""
        self.read_to_end()
        return self.collector.position

    def read_to_end(self) -> BlockCrcs:
        while not self.ended:
            self._feed_next(_PIECE)
        return self.collector.table()

    def close(self) -> None:
        return None  # the inner reader belongs to the compressed reader
