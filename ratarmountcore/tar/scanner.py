"""Streaming tar scanner: a (decompressed) byte stream in, one ``MemberRecord`` per member out.

Understands ustar, old GNU and GNU (long names ``L``/``K``, sparse ``S``), POSIX pax (local and
global extended headers, GNU sparse formats 0.0, 0.1 and 1.0) and v7 headers. It never looks at
member data except for the sparse maps of pax 1.0 sparse files. Headers are cut out of 64 KiB
reads at header offsets: small members' headers share a read (their data comes along), a large
member's data is skipped unread. Plain members (ustar/v7/GNU files, folders and links with no extended headers and
well-formed octal fields) take an inlined fast path in ``TarScanner.__iter__``; everything else
goes through ``_make_record``.
"""

from __future__ import annotations

import io
import logging
import posixpath
import re
import stat
import struct
from dataclasses import dataclass
from typing import BinaryIO, Callable, Dict, Iterable, Iterator, List, Optional, Tuple
from zlib import adler32

from ..errors import CorruptHeaderError, EmptyArchiveError, TruncatedArchiveError, UnsupportedFormatError
from ..formats import tar_header_checksum_ok

logger = logging.getLogger(__name__)

BLOCK = 512
ZERO_BLOCK = b"\0" * BLOCK

#: The largest extended header (long name, pax records) read: far above what tar writes (GNU
#: tar's names and links are at most a few KiB, pax records of extended attributes rarely
#: reach MiBs), far below what a damaged size field claims.
MAX_EXTENDED_HEADER = 256 << 20
#: Bytes read at a time into an extended header.
_READ_PIECE = 1 << 20

# Member kinds as stored in the index (one character each).
KIND_FILE = "f"
KIND_DIR = "d"
KIND_SYMLINK = "l"
KIND_HARDLINK = "h"
KIND_CHAR = "c"
KIND_BLOCK = "b"
KIND_FIFO = "p"
#: What a warning calls a member of each kind.
KIND_WORDS = {
    KIND_FILE: "file",
    KIND_DIR: "folder",
    KIND_SYMLINK: "symbolic link",
    KIND_HARDLINK: "hard link",
    KIND_CHAR: "character device",
    KIND_BLOCK: "block device",
    KIND_FIFO: "FIFO",
}

_KIND_BITS = {
    KIND_FILE: stat.S_IFREG,
    KIND_DIR: stat.S_IFDIR,
    KIND_SYMLINK: stat.S_IFLNK,
    KIND_HARDLINK: stat.S_IFREG,
    KIND_CHAR: stat.S_IFCHR,
    KIND_BLOCK: stat.S_IFBLK,
    KIND_FIFO: stat.S_IFIFO,
}

_TYPEFLAG_KIND = {
    b"0": KIND_FILE,
    b"\0": KIND_FILE,
    b"7": KIND_FILE,
    b"1": KIND_HARDLINK,
    b"2": KIND_SYMLINK,
    b"3": KIND_CHAR,
    b"4": KIND_BLOCK,
    b"5": KIND_DIR,
    b"6": KIND_FIFO,
    b"D": KIND_DIR,  # GNU dumpdir: a directory with a listing as data
    b"S": KIND_FILE,  # GNU old sparse file
}

_UID_MAX = (1 << 32) - 1  # uid_t and gid_t
_SIZE_MAX = (1 << 63) - 1  # off_t


def _settable_id(value: int) -> int:
    """An owner id as ``tar -x --same-owner`` run by root leaves it (what the index shows): one
    beyond uid_t, or (uid_t)-1, which chown(2) takes for "unchanged", leaves the file with the
    extracting user's id, root's. (The mount answered lstat of the first with EIO and showed
    65534 for the second: found by differential fuzzing in session 31.)"""
    return value if 0 <= value < _UID_MAX else 0


#: Type flags that ``_make_simple_record`` handles when no extended header precedes them.
_SIMPLE = frozenset((b"0", b"\0", b"7", b"1", b"2", b"5"))
#: Type flags never followed by data, whatever their size field says: GNU tar (listing and
#: extracting) and Python's tarfile read the next block as a header after a directory or a hard
#: link. Skipping ``size`` bytes there would hide the members those bytes hold. The same for a
#: "regular file" that ``tar -x`` makes a directory (its name ends in a slash, see
#: ``_make_record``): its extraction reads the next block as a header (``tar -t`` skips the size;
#: extraction decides, found by differential fuzzing in session 31).
_NO_DATA = frozenset((b"1", b"5"))
#: Type flags of "regular files", which ``tar -x`` makes folders when their name ends in a slash.
_FILE_TYPEFLAGS = frozenset((b"0", b"\0", b"7"))

#: The header fields the fast path needs: name, mode, uid, gid, size, mtime, chksum, typeflag,
#: linkname, magic, (version, uname, gname, devmajor, devminor skipped), prefix.
_HEADER = struct.Struct("100s8s8s8s12s12s8sc100s6s82x155s")
#: Bytes read at a time around headers (see ``TarScanner.__iter__``).
_READ_SIZE = 64 * 1024

Extents = List[Tuple[int, int]]  # (offset in the file, length); data stored back to back


@dataclass(slots=True)
class MemberRecord:
    path: str  # normalized, absolute ("/a/b"); "/" for the archive's own root entry
    kind: str
    mode: int  # st_mode with type bits
    size: int  # apparent size (real size for sparse files)
    mtime_ns: int
    uid: int
    gid: int
    linkname: str  # symlink target as stored, or normalized hard-link target path
    offset_header: int
    offset_data: int
    sparse: Optional[Extents] = None
    rdev: int = 0


def normalize_path(name: str) -> str:
    """Map a member name to an absolute path that cannot leave the root.

    Leading slashes and ``./`` are dropped, ``//`` collapsed, and ``..`` is resolved against the
    archive root, so ``../../etc/passwd`` becomes ``/etc/passwd`` *inside* the mount.
    """
    if name and name[0] not in "./" and "//" not in name and "/." not in name and name[-1] != "/":
        return "/" + name  # already normal: the common case, without normpath's cost
    path = posixpath.normpath("/" + name.lstrip("/"))
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    return path


def _check_sparse(extents: Extents, real_size: int, stored: int, name: str, pos: int) -> None:
    """A sparse member's numbers as GNU tar accepts them (each within ``off_t``), and a map whose
    data the member stores (``stored`` bytes): else its reads would take the bytes of the
    members after it."""
    if not 0 <= real_size <= _SIZE_MAX:
        raise CorruptHeaderError(f"sparse member {name} at offset {pos}: size {real_size} is out of range")
    total = 0
    for offset, length in extents:
        if not (0 <= offset <= _SIZE_MAX and 0 <= length <= _SIZE_MAX - offset):
            raise CorruptHeaderError(
                f"sparse member {name} at offset {pos}: extent ({offset}, {length}) is out of range"
            )
        total += length
    if total > stored:
        raise CorruptHeaderError(
            f"sparse member {name} at offset {pos}: its map holds {total} bytes of data, the member stores {stored}"
        )


def _sparse_numbers(values: Iterable[bytes], pos: int) -> List[int]:
    """Decimal numbers of a sparse map; CorruptHeaderError for anything else."""
    try:
        return [int(v) for v in values]
    except ValueError:
        raise CorruptHeaderError(f"invalid sparse map for member at offset {pos}") from None


def normalize_link_target(link: str) -> str:
    """``normalize_path`` for a hard link's target, keeping what says the target must be a
    folder (``a/``, ``a/.``): ``linkat`` then fails (ENOTDIR, or EPERM for a folder), where the
    plain path ``/a`` might name a file."""
    path = normalize_path(link)
    if path != "/" and (link.endswith(("/", "/.", "/..")) or link in (".", "..")):
        path += "/."
    return path


def decode_name(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _cstr(field: bytes) -> bytes:
    end = field.find(b"\0")
    return field if end < 0 else field[:end]


#: An octal number field as GNU tar reads it: leading spaces, octal digits, then a space or NUL
#: (or the field's end); what follows is ignored. (``int(text, 8)`` alone also took "0o3",
#: "1_1" and "+3", which GNU tar rejects or reads otherwise.)
_OCTAL_FIELD = re.compile(rb" *([0-7]*)(?:[ \0]|\Z)")
#: The bytes of well-formed octal fields (the fast path checks the five numeric fields at once).
_OCTAL_BYTES = b"01234567 \0"


def parse_number(field: bytes, what: str, offset: int) -> int:
    """Octal (space/NUL terminated) or GNU base-256 number field."""
    if field and field[0] & 0x80:
        if field[0] == 0xFF:
            return int.from_bytes(field, "big", signed=True)
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    match = _OCTAL_FIELD.match(field)
    if match is None:
        raise CorruptHeaderError(f"invalid {what} field {field!r} in tar header at offset {offset}")
    digits = match.group(1)
    return int(digits, 8) if digits else 0


_PAX_TIME = re.compile(r"(-?)([0-9]+)(?:\.([0-9]*))?")
_PAX_INT = re.compile(r"-?[0-9]+\Z")
_TIME_T_MAX = (1 << 63) - 1


def parse_pax_time_ns(value: str) -> Optional[int]:
    """A pax time as GNU tar's ``decode_timespec`` reads it: a leading ``[-]digits[.digits]``,
    anything after it ignored (so Python's ``mtime=1e-09`` is 1 s); digits beyond nanoseconds are
    truncated toward minus infinity. None when there is no number: GNU tar then reports a
    malformed header and keeps the ustar header's time, and so do we."""
    whole, _, frac = value.partition(".")
    if whole.isdigit() and whole.isascii() and (not frac or (frac.isdigit() and frac.isascii() and len(frac) <= 9)):
        seconds = int(whole)  # the common case, without the regular expression
        return seconds * 1_000_000_000 + int(frac.ljust(9, "0")) if seconds <= _TIME_T_MAX else None
    match = _PAX_TIME.match(value)
    if match is None:
        return None
    seconds = int(match.group(2))
    if seconds > _TIME_T_MAX:
        return None
    frac = match.group(3) or ""
    ns = int(frac[:9].ljust(9, "0"))
    if match.group(1):
        if frac[9:].strip("0"):
            ns += 1
        return -seconds * 1_000_000_000 - ns
    return seconds * 1_000_000_000 + ns


def parse_pax_int(value: str, low: int, high: int) -> Optional[int]:
    """A pax number as GNU tar's ``decode_signed_num``/``strtosysint`` reads it (an optional
    minus, then digits only); None when malformed or out of range, in which case GNU tar
    ignores the record and keeps the header's value."""
    if _PAX_INT.match(value) is None:
        return None
    number = int(value)
    return number if low <= number <= high else None


def parse_pax_records(data: bytes, offset: int) -> List[Tuple[str, bytes]]:
    """Parse ``LEN KEY=VALUE\\n`` records; keeps order and duplicates (sparse 0.0 needs both)."""
    records: List[Tuple[str, bytes]] = []
    pos = 0
    n = len(data)
    while pos < n:
        if data[pos] == 0:
            break
        space = data.find(b" ", pos)
        if space < 0:
            break
        try:
            length = int(data[pos:space])
        except ValueError:
            raise CorruptHeaderError(f"invalid pax record in extended header at offset {offset}") from None
        if length <= 0 or pos + length > n:
            raise CorruptHeaderError(f"invalid pax record length in extended header at offset {offset}")
        record = data[space + 1 : pos + length]
        if not record.endswith(b"\n") or b"=" not in record:
            raise CorruptHeaderError(f"malformed pax record in extended header at offset {offset}")
        key, _, value = record[:-1].partition(b"=")
        records.append((key.decode("utf-8", "surrogateescape"), value))
        pos += length
    return records


class TarScanner:
    """Iterate the members of a tar stream.

    ``stream`` must support ``read`` and ``seek``; forward seeks on a decompressor are fine.
    ``on_progress(position)`` is called every few hundred members. ``end``: where the archive
    ends for sure (an archive inside another, read through a window of the outer one): a member
    whose data runs past it is not yielded (``TruncatedArchiveError``), since reads of it would
    go on into what follows the window. Without it, such a member fails the scan at its end.
    """

    def __init__(
        self,
        stream: BinaryIO,
        name: str = "archive",
        on_progress: Optional[Callable[[int], None]] = None,
        end: Optional[int] = None,
    ) -> None:
        self._stream = stream
        self._name = name
        self._on_progress = on_progress
        self._end = end
        self._global_pax: Dict[str, bytes] = {}

    # --- helpers -------------------------------------------------------------------------------
    def _read_exact(self, pos: int, size: int, what: str) -> bytes:
        """``size`` bytes at ``pos``, read a piece at a time: a damaged size field (GNU tar's
        base-256 numbers reach 2**95) must not allocate what the archive does not hold."""
        if self._end is not None and pos + size > self._end:
            raise TruncatedArchiveError(f"archive ends inside {what} at offset {pos}")
        self._stream.seek(pos)
        pieces = []
        left = size
        while left > 0:
            piece = self._stream.read(min(left, _READ_PIECE))
            if not piece:
                raise TruncatedArchiveError(f"archive ends inside {what} at offset {pos}")
            pieces.append(piece)
            left -= len(piece)
        return b"".join(pieces)

    def _stream_size(self) -> int:
        self._stream.seek(0, io.SEEK_END)
        return self._stream.tell()

    # --- main loop -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[MemberRecord]:  # noqa: C901 - one state machine, kept together
        stream = self._stream
        pos = 0
        count = 0
        last_data_end = 0
        long_name: Optional[bytes] = None
        long_link: Optional[bytes] = None
        pax: Optional[List[Tuple[str, bytes]]] = None
        header_start: Optional[int] = None  # start of the first of chained meta headers
        # Headers are cut out of a buffer of the bytes at [buf_start, buf_start + len(buf)):
        # small members' headers lie close together, so one read serves several of them, while a
        # large member's data is skipped without being read.
        buf = b""
        buf_start = 0
        unpack_header = _HEADER.unpack_from
        on_progress = self._on_progress
        end = self._end

        while True:
            off = pos - buf_start
            if off < 0 or off + BLOCK > len(buf):
                stream.seek(pos)
                buf = stream.read(_READ_SIZE)
                buf_start = pos
                off = 0
            block = buf[off : off + BLOCK]
            if len(block) < BLOCK:
                if pos == 0 and not block:
                    raise EmptyArchiveError("file is empty")
                if pos == 0 and block[257:262] != b"ustar":  # (a cut-off header keeps its magic)
                    raise UnsupportedFormatError(f"not a tar archive ({len(block)} bytes, shorter than one tar header)")
                if block:
                    raise TruncatedArchiveError(f"archive ends inside a header at offset {pos}")
                # EOF exactly at a header boundary: accept as the end, unless data is missing.
                # (GNU tar does the same.) A stream that ends before the padded end of the last
                # member's data was cut off.
                if self._stream_size() < pos:
                    raise TruncatedArchiveError(f"archive ends inside member data before offset {last_data_end}")
                if long_name is not None or long_link is not None or pax is not None:
                    raise TruncatedArchiveError("archive ends after an extended header without its member")
                return
            if block == ZERO_BLOCK:
                # End-of-archive marker. Data of the previous member is known to be present.
                if long_name is not None or pax is not None:
                    raise CorruptHeaderError(f"extended header at offset {header_start} is not followed by a member")
                return

            if header_start is None and not self._global_pax:
                # Fast path: a plain file, folder or link with no extended headers before it and
                # well-formed octal fields -- the members of most archives. Anything unusual
                # (other type flags, base-256 or malformed numbers, a bad checksum) falls through
                # to the general code below, which decides and reports exactly as before.
                # Must agree with ``_make_record`` (tests compare both).
                (raw_name, f_mode, f_uid, f_gid, f_size, f_mtime, f_chksum, typeflag, raw_link, magic, prefix) = (
                    unpack_header(block)
                )
                record = None
                if typeflag in _SIMPLE and not block[100:148].translate(None, _OCTAL_BYTES):
                    try:
                        if block.isascii():  # tar_header_checksum_ok's fast case, inlined
                            stored = int(f_chksum.replace(b"\0", b" "), 8)
                            ok = stored == (adler32(block) & 0xFFFF) + 255 - sum(f_chksum)
                        else:
                            ok = tar_header_checksum_ok(block)
                        size = int(f_size.rstrip(b"\0") or b"0", 8)
                        mode_bits = int(f_mode.rstrip(b"\0") or b"0", 8) & 0o7777
                        uid = int(f_uid.rstrip(b"\0") or b"0", 8)
                        gid = int(f_gid.rstrip(b"\0") or b"0", 8)
                        mtime = int(f_mtime.rstrip(b"\0") or b"0", 8)
                    except ValueError:
                        ok = False
                    if ok and size >= 0:
                        raw_name = raw_name.partition(b"\0")[0]
                        if magic == b"ustar\0" and prefix[0] != 0:
                            raw_name = prefix.partition(b"\0")[0] + b"/" + raw_name
                        kind = _TYPEFLAG_KIND[typeflag]
                        if kind == KIND_FILE and raw_name.endswith(b"/") and raw_name != b"/":
                            kind = KIND_DIR
                        name = raw_name.decode("utf-8", "surrogateescape")
                        if name and name[0] not in "./" and "//" not in name and "/." not in name and name[-1] != "/":
                            path = "/" + name
                        else:
                            path = normalize_path(name)
                        link = ""
                        real_size = size if kind == KIND_FILE else 0
                        if kind == KIND_SYMLINK or kind == KIND_HARDLINK:
                            raw_link = raw_link.partition(b"\0")[0]
                            link = raw_link.decode("utf-8", "surrogateescape")
                            if kind == KIND_HARDLINK:
                                link = normalize_link_target(link)
                            else:
                                mode_bits = 0o777
                                real_size = len(raw_link)
                        record = MemberRecord(
                            path,
                            kind,
                            mode_bits | _KIND_BITS[kind],
                            real_size,
                            mtime * 1_000_000_000,
                            uid,
                            gid,
                            link,
                            pos,
                            pos + BLOCK,
                        )
                if record is not None:
                    data_end = pos + BLOCK + (size if typeflag not in _NO_DATA and kind != KIND_DIR else 0)
                    if end is not None and data_end > end:
                        raise TruncatedArchiveError(f"{record.path} ends after the end of the archive ({end} bytes)")
                    if data_end > last_data_end:
                        last_data_end = data_end
                    pos = data_end + (-data_end & (BLOCK - 1))
                    count += 1
                    if on_progress is not None and not count & 511:
                        on_progress(pos)
                    yield record
                    continue

            if not tar_header_checksum_ok(block):
                if pos == 0:
                    raise UnsupportedFormatError("not a tar archive (no valid tar header at the start)")
                raise CorruptHeaderError(f"corrupted tar header (checksum mismatch) at offset {pos}")

            typeflag = block[156:157]
            size = parse_number(block[124:136], "size", pos)
            if size < 0:
                raise CorruptHeaderError(f"negative member size in tar header at offset {pos}")
            if size > _SIZE_MAX:
                raise CorruptHeaderError(f"member size {size} in tar header at offset {pos} is out of range")
            data_start = pos + BLOCK
            data_end_padded = data_start + ((size + BLOCK - 1) // BLOCK) * BLOCK
            if header_start is None:
                header_start = pos

            if typeflag in (b"L", b"K", b"x", b"X", b"g"):
                if size > MAX_EXTENDED_HEADER:
                    raise CorruptHeaderError(f"the extended header at offset {pos} claims {size} bytes")
                payload = self._read_exact(data_start, size, "an extended header")
                if typeflag == b"L":
                    long_name = _cstr(payload)
                elif typeflag == b"K":
                    long_link = _cstr(payload)
                elif typeflag == b"g":
                    # A new global header replaces the previous one as a whole (GNU tar's
                    # xheader_decode_global drops the old override list).
                    self._global_pax = dict(parse_pax_records(payload, pos))
                    header_start = None
                else:
                    pax = (pax or []) + parse_pax_records(payload, pos)
                pos = data_end_padded
                continue
            if typeflag in (b"V", b"N"):  # volume label, old GNU rename list: not members
                pos = data_end_padded
                header_start = None
                continue
            if typeflag == b"M":
                raise UnsupportedFormatError(f"multi-volume continuation member at offset {pos} is not supported")

            if long_name is None and long_link is None and pax is None and not self._global_pax and typeflag in _SIMPLE:
                record, data_end = self._make_simple_record(block, pos, size, typeflag)
            else:
                record, data_end = self._make_record(block, pos, header_start, size, long_name, long_link, pax)
            if typeflag in _NO_DATA or (record.kind == KIND_DIR and typeflag in _FILE_TYPEFLAGS):
                data_end = pos + BLOCK  # (whatever the size field says)
            if end is not None and data_end > end:
                raise TruncatedArchiveError(f"{record.path} ends after the end of the archive ({end} bytes)")
            long_name = long_link = pax = None
            header_start = None
            last_data_end = max(last_data_end, data_end)
            pos = ((data_end + BLOCK - 1) // BLOCK) * BLOCK
            count += 1
            if on_progress is not None and count % 512 == 0:
                on_progress(pos)
            yield record

    def _make_simple_record(self, block: bytes, pos: int, size: int, typeflag: bytes) -> Tuple[MemberRecord, int]:
        """The common case -- a plain file, folder or link with no extended headers -- without
        the general path's bookkeeping. Must agree with ``_make_record`` (tests compare both)."""
        raw_name = block[0:100]
        end = raw_name.find(b"\0")
        if end >= 0:
            raw_name = raw_name[:end]
        if block[257:263] == b"ustar\0" and block[345] != 0:
            prefix = block[345:500]
            end = prefix.find(b"\0")
            raw_name = (prefix if end < 0 else prefix[:end]) + b"/" + raw_name
        kind = _TYPEFLAG_KIND[typeflag]
        if kind == KIND_FILE and raw_name.endswith(b"/") and raw_name != b"/":
            kind = KIND_DIR
        link = ""
        if kind == KIND_SYMLINK or kind == KIND_HARDLINK:
            raw_link = block[157:257]
            end = raw_link.find(b"\0")
            if end >= 0:
                raw_link = raw_link[:end]
            link = raw_link.decode("utf-8", "surrogateescape")
            if kind == KIND_HARDLINK:
                link = normalize_link_target(link)
        if kind == KIND_SYMLINK:
            mode_bits = 0o777
            real_size = len(raw_link)
        else:
            mode_bits = parse_number(block[100:108], "mode", pos) & 0o7777
            real_size = size if kind == KIND_FILE else 0
        record = MemberRecord(
            path=normalize_path(raw_name.decode("utf-8", "surrogateescape")),
            kind=kind,
            mode=mode_bits | _KIND_BITS[kind],
            size=real_size,
            mtime_ns=parse_number(block[136:148], "mtime", pos) * 1_000_000_000,
            uid=_settable_id(parse_number(block[108:116], "uid", pos)),
            gid=_settable_id(parse_number(block[116:124], "gid", pos)),
            linkname=link,
            offset_header=pos,
            offset_data=pos + BLOCK,
        )
        return record, pos + BLOCK + size

    def _make_record(  # noqa: C901 - field precedence rules of three formats
        self,
        block: bytes,
        pos: int,
        header_start: int,
        size: int,
        long_name: Optional[bytes],
        long_link: Optional[bytes],
        local_pax: Optional[List[Tuple[str, bytes]]],
    ) -> Tuple[MemberRecord, int]:
        typeflag = block[156:157]
        magic = block[257:263]
        is_ustar = magic == b"ustar\0"
        is_oldgnu = block[257:265] == b"ustar  \0"

        raw_name = _cstr(block[0:100])
        if is_ustar:
            prefix = _cstr(block[345:500])
            if prefix:
                raw_name = prefix + b"/" + raw_name
        if long_name is not None:
            raw_name = long_name
        raw_link = long_link if long_link is not None else _cstr(block[157:257])

        mode_bits = parse_number(block[100:108], "mode", pos) & 0o7777
        uid = parse_number(block[108:116], "uid", pos)
        gid = parse_number(block[116:124], "gid", pos)
        mtime_ns = parse_number(block[136:148], "mtime", pos) * 1_000_000_000
        data_offset = pos + BLOCK
        stored_size = size
        real_size = size
        sparse: Optional[Extents] = None
        rdev = 0

        kind = _TYPEFLAG_KIND.get(typeflag, KIND_FILE)
        if kind in (KIND_CHAR, KIND_BLOCK) and (is_ustar or is_oldgnu):
            major = parse_number(block[329:337], "devmajor", pos)
            minor = parse_number(block[337:345], "devminor", pos)
            rdev = ((major & 0xFFF) << 8) | (minor & 0xFF) | ((minor & ~0xFF) << 12) | ((major & ~0xFFF) << 32)

        if typeflag == b"S":  # old GNU sparse: map in the header plus extension blocks
            sparse = []
            self._append_sparse_entries(block[386:482], 4, sparse, pos)
            extended = block[482]
            real_size = parse_number(block[483:495], "realsize", pos)
            ext_pos = data_offset
            while extended:
                ext = self._read_exact(ext_pos, BLOCK, "a sparse extension header")
                self._append_sparse_entries(ext[:504], 21, sparse, ext_pos)
                extended = ext[504]
                ext_pos += BLOCK
            data_offset = ext_pos

        pax: Dict[str, bytes] = dict(self._global_pax)
        if local_pax:
            pax.update(local_pax)
        if pax:
            charset_binary = pax.get("hdrcharset") == b"BINARY"

            def text(key: str) -> Optional[str]:
                value = pax.get(key)
                if value is None:
                    return None
                return value.decode("utf-8", "surrogateescape") if not charset_binary else decode_name(value)

            def number(key: str) -> Optional[int]:
                value = text(key)
                if value is None:
                    return None
                try:
                    return int(value)
                except ValueError:
                    raise CorruptHeaderError(f"invalid pax {key}={value!r} for member at offset {pos}") from None

            if "path" in pax:
                raw_name = pax["path"]
            if "linkpath" in pax:
                raw_link = pax["linkpath"]
            # Malformed or out-of-range uid/gid/size/mtime records are ignored, with the header's
            # value kept, as GNU tar does (it extracts such members and reports the record).
            for key in ("uid", "gid", "size", "mtime"):
                value = text(key)
                if value is None:
                    continue
                if key == "mtime":
                    parsed = parse_pax_time_ns(value)
                else:
                    parsed = parse_pax_int(value, 0, _UID_MAX if key != "size" else _SIZE_MAX)
                if parsed is None:
                    logger.warning("%s: ignoring malformed pax record %s=%r at offset %d", self._name, key, value, pos)
                elif key == "uid":
                    uid = parsed
                elif key == "gid":
                    gid = parsed
                elif key == "size":
                    stored_size = real_size = parsed
                else:
                    mtime_ns = parsed
            if (
                "GNU.sparse.major" in pax
                or "GNU.sparse.map" in pax
                or "GNU.sparse.offset" in pax
                or "GNU.sparse.name" in pax
            ):
                sparse, real_size, data_offset, raw_name = self._pax_sparse(
                    local_pax or [], pax, number, sparse, real_size, data_offset, stored_size, raw_name, pos
                )

        if typeflag in _FILE_TYPEFLAGS and raw_name.endswith(b"/") and raw_name != b"/":
            # GNU tar (like BSD tar and v7) extracts a "regular file" whose final name -- after
            # long-name and pax overrides -- ends in a slash as a directory, in every format.
            # Not one named "/" alone: its slash is not a trailing one (gnulib's
            # strip_trailing_slashes keeps it), and the file cannot replace the root.
            kind = KIND_DIR
        if kind in (KIND_DIR, KIND_SYMLINK, KIND_HARDLINK, KIND_CHAR, KIND_BLOCK, KIND_FIFO):
            real_size = 0 if kind != KIND_SYMLINK else len(raw_link)
        if kind == KIND_SYMLINK:
            mode_bits = 0o777  # what lstat shows for every extracted symlink on Linux
        # Old GNU sparse extension blocks come on top of the stored size; a pax 1.0 sparse map
        # is part of it.
        data_end = (data_offset if typeflag == b"S" else pos + BLOCK) + stored_size

        name = decode_name(raw_name)
        if sparse is not None:
            _check_sparse(sparse, real_size, data_end - data_offset, name, pos)
        link = decode_name(raw_link)
        if kind == KIND_HARDLINK:
            link = normalize_link_target(link)
        record = MemberRecord(
            path=normalize_path(name),
            kind=kind,
            mode=mode_bits | _KIND_BITS[kind],
            size=real_size,
            mtime_ns=mtime_ns,
            uid=_settable_id(uid),
            gid=_settable_id(gid),
            linkname=link,
            offset_header=header_start,
            offset_data=data_offset,
            sparse=sparse,
            rdev=rdev,
        )
        return record, data_end

    @staticmethod
    def _append_sparse_entries(area: bytes, count: int, out: Extents, pos: int) -> None:
        for i in range(count):
            entry = area[i * 24 : i * 24 + 24]
            if entry[:12].strip(b"\0") == b"":
                break
            out.append(
                (parse_number(entry[:12], "sparse offset", pos), parse_number(entry[12:24], "sparse length", pos))
            )

    def _pax_sparse(
        self,
        local_pax: List[Tuple[str, bytes]],
        pax: Dict[str, bytes],
        number: Callable[[str], Optional[int]],
        sparse: Optional[Extents],
        real_size: int,
        data_offset: int,
        stored_size: int,
        raw_name: bytes,
        pos: int,
    ) -> Tuple[Optional[Extents], int, int, bytes]:
        major = number("GNU.sparse.major")
        if "GNU.sparse.name" in pax:
            raw_name = pax["GNU.sparse.name"]
        if major == 1:  # 1.0: the map is at the start of the data, in decimal lines
            real_size = number("GNU.sparse.realsize") or 0
            sparse, map_bytes = self._read_sparse_map_1_0(data_offset, stored_size, pos)
            return sparse, real_size, data_offset + map_bytes, raw_name
        if "GNU.sparse.map" in pax:  # 0.1
            values = _sparse_numbers((v for v in pax["GNU.sparse.map"].split(b",") if v), pos)
            sparse = list(zip(values[0::2], values[1::2]))
            real_size = number("GNU.sparse.size") or number("GNU.sparse.realsize") or 0
            return sparse, real_size, data_offset, raw_name
        offsets = _sparse_numbers((v for k, v in local_pax if k == "GNU.sparse.offset"), pos)
        if offsets:  # 0.0: repeated offset/numbytes records
            lengths = _sparse_numbers((v for k, v in local_pax if k == "GNU.sparse.numbytes"), pos)
            sparse = list(zip(offsets, lengths))
            real_size = number("GNU.sparse.size") or 0
        return sparse, real_size, data_offset, raw_name

    def _read_sparse_map_1_0(self, data_offset: int, stored_size: int, pos: int) -> Tuple[Extents, int]:
        chunk = bytearray(self._read_exact(data_offset, min(stored_size, BLOCK), "a sparse map"))
        first, complete, _ = bytes(chunk).partition(b"\n")
        count = _sparse_numbers([first], pos)[0]
        if not complete or count < 0:
            raise CorruptHeaderError(f"invalid sparse map for member at offset {pos}")
        # Blocks until the map's 2 * count + 1 lines are complete, the newlines counted as they
        # come (a map of many extents spans thousands of blocks: no split of all of it per block).
        newlines = chunk.count(b"\n")
        blocks = 1
        while newlines < 2 * count + 1 and blocks * BLOCK < stored_size:
            block = self._read_exact(data_offset + blocks * BLOCK, BLOCK, "a sparse map")
            chunk += block
            newlines += block.count(b"\n")
            blocks += 1
        if newlines < 2 * count:
            raise CorruptHeaderError(f"truncated sparse map for member at offset {pos}")
        lines = bytes(chunk).split(b"\n", 2 * count + 1)
        values = _sparse_numbers(lines[1 : 1 + 2 * count], pos)
        map_len = len(b"\n".join(lines[: 1 + 2 * count])) + 1
        map_bytes = ((map_len + BLOCK - 1) // BLOCK) * BLOCK
        return list(zip(values[0::2], values[1::2])), map_bytes
