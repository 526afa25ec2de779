"""CRC-32C of every 16 KiB block of the frames of a zstd or xz file that nothing else checks.

A frame decoded whole is checked by its own checksum when it carries one (zstd's XXH64, xz's
CRC32/CRC64/SHA-256), before any byte of it is served. Two kinds of frames are not:

* frames without a checksum (``python-zstandard`` and many seekable-zstd writers leave it out:
  a bit flipped in such a .tar.zst after indexing made reads return wrong bytes, 1-23 members
  per flip, measured before this module existed);
* frames too large to decode whole (a single-frame .tar.zst, an xz file of one block), which
  are read through streaming cursors: their checksum is only reached at the frame's end, after
  the bytes before it were served (wrong bytes again, with or without a checksum).

For those frames the first pass, which decodes them anyway, records the CRC-32C of each block
(blocks aligned to the frame's start; the last one may be short), and every later read of them is
checked against it. The table is stored in the index beside the frame table: per frame the
number of blocks recorded (0 for frames that check themselves), then the checksums.
"""

from __future__ import annotations

import array
from typing import Dict, List, Optional, Sequence

from .base import pack_seek_points, unpack_seek_points
from .block_crcs import BLOCK, BlockCrcs, Buffer, CrcCollector


def crcs_of(data: Buffer, block: int = BLOCK) -> "array.array[int]":
    """The block checksums of one whole frame's data."""
    collector = CrcCollector(block)
    collector.feed(data)
    return collector.checksums()


class FrameCrcs:
    """The block checksums of the frames that need them, by frame number."""

    def __init__(self, by_frame: Dict[int, "array.array[int]"], block: int = BLOCK) -> None:
        self.by_frame = by_frame
        self.block = block

    def covers(self, frame: int) -> bool:
        return frame in self.by_frame

    def verify(self, path: str, frame: int, start: int, pieces: Sequence[Buffer], frame_size: int) -> None:
        """Raise ``CorruptDataError`` unless the data of ``frame`` from ``start`` (a block
        boundary inside it), given as consecutive ``pieces`` that end at a block boundary or at
        the frame's end, matches the recorded checksums."""
        table = BlockCrcs(self.by_frame[frame], frame_size, self.block)
        table.verify_pieces(path, start, pieces, f"decompressed data of frame {frame}")

    def parts(self, frames: int) -> List[bytes]:
        counts = array.array("I", (len(self.by_frame.get(frame, ())) for frame in range(frames)))
        crcs = array.array("I")
        for frame in sorted(self.by_frame):
            crcs.extend(self.by_frame[frame])
        return pack_seek_points({"block": self.block, "frames": frames}, counts.tobytes() + crcs.tobytes())

    @classmethod
    def from_parts(cls, parts: Sequence[bytes], frame_sizes: Sequence[int]) -> Optional["FrameCrcs"]:
        """The stored table, or None when there is none or it does not fit the frame table."""
        found = unpack_seek_points(list(parts))
        if found is None:
            return None
        header, payload = found
        block, frames = int(header["block"]), int(header["frames"])
        if frames != len(frame_sizes) or block <= 0 or len(payload) < 4 * frames:
            return None
        counts = array.array("I")
        counts.frombytes(payload[: 4 * frames])
        crcs = array.array("I")
        crcs.frombytes(payload[4 * frames :])
        by_frame: Dict[int, "array.array[int]"] = {}
        position = 0
        for frame, count in enumerate(counts):
            if count:
                if count != -(-frame_sizes[frame] // block):
                    return None
                by_frame[frame] = crcs[position : position + count]
                position += count
        return cls(by_frame, block) if position == len(crcs) else None
