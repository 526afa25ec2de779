"""Magic-byte detection of archive and compression formats (stdlib only)."""

from __future__ import annotations

import enum
import zlib
from typing import BinaryIO, Callable, Optional


class FormatId(enum.Enum):
    TAR = "tar"
    GZIP = "gzip"
    BZIP2 = "bzip2"
    ZSTD = "zstd"
    XZ = "xz"
    UNKNOWN = "unknown"


COMPRESSIONS = (FormatId.GZIP, FormatId.BZIP2, FormatId.ZSTD, FormatId.XZ)


def tar_header_checksum_ok(block: bytes) -> bool:
    """True when ``block`` (512 bytes) is a tar header with a valid checksum."""
    if len(block) < 512:
        return False
    field = block[148:156]
    try:
        stored = int(field.replace(b"\0", b" ").strip() or b"-1", 8)
    except ValueError:
        return False
    block = block[:512]
    if block.isascii():
        # Every byte < 128: the signed and unsigned sums agree, and the sum (at most 127 * 512 <
        # 65521) is exactly the low half of Adler-32 minus its initial 1 -- without a Python-level
        # loop over 512 bytes (about ten times faster than sum()).
        return stored == (zlib.adler32(block) & 0xFFFF) - 1 - sum(field) + 8 * 32
    unsigned = sum(block) - sum(field) + 8 * 32
    if stored == unsigned:
        return True
    signed = sum((b - 256 if b > 127 else b) for b in block[:148] + block[156:512]) + 8 * 32
    return stored == signed


def has_tar_magic(block: bytes) -> bool:
    """True when ``block`` carries the magic of a ustar, pax or GNU header (whatever its checksum
    says): a tar whose first header is damaged, not some other data."""
    return block[257:262] == b"ustar"


def sniff_bytes(head: bytes) -> FormatId:
    if head[:2] == b"\x1f\x8b":
        return FormatId.GZIP
    if head[:3] == b"BZh" and head[3:4] in b"123456789" and head[4:10] in (b"1AY&SY", b"\x17rE8P\x90"):
        return FormatId.BZIP2
    if head[:4] == b"\x28\xb5\x2f\xfd":
        return FormatId.ZSTD
    # Skippable zstd frames (e.g. the seek table of a seekable zstd archive placed first).
    if len(head) >= 4 and head[1:4] == b"\x2a\x4d\x18" and 0x50 <= head[0] <= 0x5F:
        return FormatId.ZSTD
    if head[:6] == b"\xfd7zXZ\x00":
        return FormatId.XZ
    if tar_header_checksum_ok(head[:512]) or (len(head) >= 512 and head[:512] == b"\0" * 512):
        return FormatId.TAR
    return FormatId.UNKNOWN


#: Formats that are not ours, by their first bytes: what to tell a user who gives one (it was
#: "not a tar archive (112 bytes, shorter than one tar header)", counting compressed bytes).
_OTHER_FORMATS = (
    (b"PK\x03\x04", "a zip archive"),
    (b"PK\x05\x06", "a zip archive"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
    (b"Rar!\x1a\x07", "a RAR archive"),
    (b"\x04\x22\x4d\x18", "lz4 data (not supported: recompress it with zstd)"),
    (b"LZIP", "lzip data (not supported: recompress it with xz)"),
    (b"\x1f\x9d", "compress (.Z) data (not supported: recompress it with gzip)"),
    (b"hsqs", "a SquashFS image (squashfuse mounts it)"),
    (b"070701", "a cpio archive"),
    (b"070707", "a cpio archive"),
    (b"!<arch>\n", "an ar archive"),
)


def other_format(head: bytes) -> Optional[str]:
    """What ``head`` (a file's first bytes) is when it is a format we know of but do not read."""
    for magic, what in _OTHER_FORMATS:
        if head.startswith(magic):
            return what
    if len(head) >= 13 and head[0] == 0x5D and head[1:5] in _LZMA_DICTIONARIES:
        return "LZMA-alone (.lzma) data (not supported: recompress it with xz)"
    if len(head) >= 2 and head[0] == 0x78 and (head[0] << 8 | head[1]) % 31 == 0:
        return "zlib data (not supported: recompress it with gzip)"
    return None


#: Dictionary sizes ``xz --format=lzma`` and ``lzma`` write (2^n and 2^n + 2^(n-1)).
_LZMA_DICTIONARIES = frozenset(
    size.to_bytes(4, "little") for n in range(12, 31) for size in (1 << n, (1 << n) + (1 << (n - 1)))
)


#: Decompressed data that is all zeros up to this long is an empty tar (GNU tar writes records of
#: 10 KiB; ``-b 2048`` of 1 MiB); longer, or zeros then other data, it is a single file.
EMPTY_TAR_MAX = 1 << 20


def is_tar_stream(head: bytes, start: Callable[[int], bytes]) -> bool:
    """Whether decompressed data beginning with ``head`` (at least its first 512 bytes) is a tar.
    ``start(n)`` gives its first ``n`` bytes; it is asked only when ``head`` begins with a block of
    zeros, which an empty tar does, but so do a compressed disk image (an ext4 image: 1,024 zero
    bytes) and a file of zeros, which were shown as an empty folder (found by fuzzing)."""
    if sniff_bytes(head) is not FormatId.TAR:
        return False
    if head[:512].strip(b"\0"):
        return True  # (a valid header)
    data = start(EMPTY_TAR_MAX + 1)
    return len(data) <= EMPTY_TAR_MAX and not data.strip(b"\0")


def sniff(fileobj: BinaryIO) -> FormatId:
    """Detect the format of ``fileobj`` from its first bytes; restores the position."""
    pos = fileobj.tell()
    try:
        head = fileobj.read(512)
    finally:
        fileobj.seek(pos)
    return sniff_bytes(head)


#: The extension ``OpenOptions.strip_tar_extension`` takes off the archives shown as folders.
TAR_EXTENSION = ".tar"


def stripped_tar_name(name: str) -> str:
    """``NAME.tar`` -> ``NAME`` (of the last component of a path; lower case only, so that no two
    names strip to one; a name that is only the extension stays as it is)."""
    if name.endswith(TAR_EXTENSION) and len(name.rsplit("/", 1)[-1]) > len(TAR_EXTENSION):
        return name[: -len(TAR_EXTENSION)]
    return name
