"""Span-cache misses of a .tar.gz that decode only as far as the read needs.

A small read that misses the span cache (``spans.py``) decoded its whole span -- from the seek
point before it to the next one, ~400 KB in the 100,000-file benchmark archive -- with a
rapidgzip decoder, although the member it wants lies halfway in on average. The stored seek
points (rapidgzip's export in gztool format: decompressed offset, compressed byte offset, bit
offset, the 32 KiB window before it) are all a deflate decoder needs to start there, so this
module resumes the stream at a seek point with ISA-L's zlib-compatible decoder (python-isal)
and stops as soon as the read's bytes are out. Measured in-process on that archive: a miss
decoded to a random point of its span took 1.1 ms, the whole span through rapidgzip ~1.75 ms.

A seek point that does not start on a byte boundary needs the bits before it skipped, and
Python's and ISA-L's zlib interfaces have no ``inflatePrime``. So the decoder is given a
prefix of our own first: complete deflate blocks with fixed codes (an empty one is 10 bits
long) whose length makes the seek point's bits line up with the file's bytes, which are then
passed on as they are. An odd number of bits needs an odd number of 9-bit literals: the last
bytes of the window are sent as literals (those of them at 144 or above have 9-bit codes) and
taken off the dictionary, so the history the stream refers back to is unchanged, and their
output is dropped. Where the window's end has no such bytes (text), the block holds one match
instead, of length 3 and a distance with an odd number of extra bits, that copies the first of
the bytes taken off from where they occur before in the window (then literals for the rest). An
empty window (nothing before the point is referred to up to the next one: rapidgzip stores the
window empty) gets a made-up byte of history to send as the literal. A stored block at the point
is copied out directly, and the decoder starts after it, on a byte boundary. Session 28 read
the compressed bytes shifted by the bit offset instead where it found no 9-bit literal. That is
wrong for a stored block: its length follows at the next byte boundary of the file, which the
shift moves, and half of such misread lengths pass their check (found in session 29: the block
checksums refused the bytes, so an intact archive gave EIO). Every span of the two benchmark
archives and of a tar.gz of JPEG-like files now decodes here, none left to the caller.

Since session 29 every span-cache miss of a rapidgzip reader comes here first, whole spans too,
and the stream's start (read with its gzip header): a rapidgzip decoder keeps decoded chunks of
its own, 8-10 MiB each beside the span cache (1,000 random reads of the 10,000-file benchmark
archive: 81-82 MiB resident before, 59 after, as fast).

Anything unusual (no window, a window of the wrong size, a gzip member that ends before the
read's end, damaged data, python-isal missing) returns None and the caller decodes the whole
span with rapidgzip; the bytes served are checked against the block checksums either way.
"""

from __future__ import annotations

import array
import bisect
import logging
import struct
import zlib
from typing import Any, Callable, List, Optional, Tuple

logger = logging.getLogger(__name__)

#: Decompressed bytes a deflate window holds.
WINDOW = 32 * 1024
#: Compressed bytes read at a time.
STEP = 32 * 1024
_MAGIC = bytes(8) + b"gzipindx"
_POINT = struct.Struct(">QQII")
#: zlib's ``wbits`` for a gzip member (header and trailer included).
GZIP_WBITS = 31


def _isal_zlib() -> Any:
    try:
        from isal import isal_zlib
    except ImportError:
        return None
    return isal_zlib


class DeflateResumer:
    """Decodes from the seek points of one gzip stream, given as a gztool-format index."""

    def __init__(self, payload: bytes, read: Callable[[int, int], bytes], library: Any) -> None:
        """``read(offset, size)``: bytes of the compressed file."""
        self._payload = payload
        self._read = read
        self._library = library
        self._outs: "array.array[int]" = array.array("Q")
        self._ins: "array.array[int]" = array.array("Q")
        self._bits = bytearray()
        self._windows: "array.array[int]" = array.array("Q")  # offset of each window in payload
        self._window_sizes: "array.array[int]" = array.array("I")
        self.decodes = 0
        self.decoded_bytes = 0
        #: Decodes from a seek point inside a byte: made with a prefix, and left to the caller.
        self.prefixed = 0
        self.refused = 0

    @classmethod
    def of_gztool_index(cls, payload: bytes, read: Callable[[int, int], bytes]) -> Optional["DeflateResumer"]:
        """None when python-isal is missing or ``payload`` is not a gztool index (version 0)."""
        library = _isal_zlib()
        if library is None or len(payload) < 32 or payload[:16] != _MAGIC:
            return None
        resumer = cls(payload, read, library)
        (count, _capacity) = struct.unpack_from(">QQ", payload, 16)
        position = 32
        for _ in range(count):
            if position + _POINT.size > len(payload):
                return None
            out, offset, bits, size = _POINT.unpack_from(payload, position)
            if bits > 7 or position + _POINT.size + size > len(payload):
                return None
            resumer._outs.append(out)
            resumer._ins.append(offset)
            resumer._bits.append(bits)
            resumer._windows.append(position + _POINT.size)
            resumer._window_sizes.append(size)
            position += _POINT.size + size
        return resumer

    def starts(self) -> List[int]:
        """The decompressed offsets of the seek points."""
        return self._outs.tolist()

    def decode(self, start: int, end: int) -> Optional[bytes]:
        """The decompressed bytes ``[start, end)`` where ``start`` is a seek point's offset;
        None when this cannot be done here (see the module docstring)."""
        if end <= start:
            return None
        if start == 0:  # the stream's start, with the gzip header (read by the decoder: wbits 31)
            return self._counted(self._inflate_checked(b"", 0, 0, end, GZIP_WBITS))
        i = bisect.bisect_left(self._outs, start)
        if i >= len(self._outs) or self._outs[i] != start:
            return None
        size = self._window_sizes[i]
        # An empty window: none of the data after the seek point refers back before it
        # (rapidgzip stores such windows empty); a reference that does is an error below.
        window = b""
        if size:
            try:
                window = zlib.decompress(self._payload[self._windows[i] : self._windows[i] + size])
            except zlib.error:
                return None
            if len(window) != min(start, WINDOW):
                return None
        bits = self._bits[i]
        if not window and bits % 2 and (i + 1 == len(self._outs) or end <= self._outs[i + 1]):
            # An empty window and an odd bit offset: the prefix's 9-bit literal must come from
            # somewhere. Nothing before the point is referred to up to the next one (why
            # rapidgzip stored the window empty), so a byte of history made up is never read.
            window = _UNREFERENCED
        return self._counted(self._inflate_checked(window, self._ins[i], bits, end - start))

    def _counted(self, data: Optional[bytes]) -> Optional[bytes]:
        if data is not None:
            self.decodes += 1
            self.decoded_bytes += len(data)
        return data

    def _after_a_stored_block(
        self, window: bytes, offset: int, bits: int, want: int
    ) -> Optional[Tuple[bytes, bytes, int]]:
        """When the block at the seek point (at bit ``8 - bits`` of the byte before ``offset``)
        is a stored one, not the last: its bytes (up to ``want``), the window after them, and the
        byte where the next block begins (on a byte boundary: no prefix needed there)."""
        first = (offset - 1) * 8 + 8 - bits  # the block's first bit
        head = self._read(first // 8, 2)
        if len(head) != 2:
            return None
        header = int.from_bytes(head, "little") >> (first % 8)
        if header & 0b111 != 0b000:  # BFINAL 0, BTYPE 00: stored
            return None
        lengths = (first + 3 + 7) // 8  # LEN and NLEN follow at the next byte boundary
        size, check = struct.unpack("<HH", self._read(lengths, 4).ljust(4, b"\0"))
        if size ^ 0xFFFF != check:
            return None
        data = self._read(lengths + 4, min(size, want))
        if len(data) != min(size, want):
            return None
        return data, (window + data)[-WINDOW:], lengths + 4 + size

    def _inflate_checked(self, window: bytes, offset: int, bits: int, want: int, wbits: int = -15) -> Optional[bytes]:
        try:
            return self._inflate(window, offset, bits, want, wbits)
        except self._library.error as exc:
            logger.debug("resuming the deflate stream at byte %d failed: %s", offset, exc)
            return None

    def _inflate(self, window: bytes, offset: int, bits: int, want: int, wbits: int = -15) -> Optional[bytes]:
        # With ``bits`` set, the block begins with the top ``bits`` bits of the byte before
        # ``offset`` (deflate fills bytes from the lowest bit up).
        position = offset
        head = b""
        drop = 0
        if bits:
            before = self._read(offset - 1, 1)
            if len(before) != 1:
                return None
            lined_up = _prefix(window, bits, before[0] >> (8 - bits))
            if lined_up is None:
                # No prefix: an odd bit offset and a window that offers neither 9-bit literals
                # nor a match to make one -- mostly an empty window, before a stored block.
                # (The compressed bytes read shifted by the bits before the block, as up to
                # session 28, misplace the byte boundary that a stored block's length follows:
                # wrong bytes for half of them, refused by the block checksums as damage.)
                stored = self._after_a_stored_block(window, offset, bits, want)
                if stored is None:
                    self.refused += 1
                    return None
                data, window, offset = stored
                if len(data) >= want:
                    return data[:want]
                rest = self._inflate(window, offset, 0, want - len(data))
                return None if rest is None else data + rest
            head, drop = lined_up
            self.prefixed += 1
            window = window[: len(window) - drop]
        library = self._library
        decoder = library.decompressobj(wbits=wbits, zdict=window) if window else library.decompressobj(wbits=wbits)
        pieces = []
        produced = 0
        if head:
            out = decoder.decompress(head)
            if len(out) < drop or decoder.eof:
                return None
            pieces.append(out[drop : drop + want])  # (the prefix's literals come out first)
            produced = len(pieces[0])
        while produced < want:
            data = self._read(position, STEP)
            if not data:
                return None  # the compressed data ends first
            position += len(data)
            out = decoder.decompress(data, want - produced)
            pieces.append(out)
            produced += len(out)
            if produced < want and decoder.eof:
                return None  # a gzip member ends first: the caller's decoder reads members
        return b"".join(pieces)


def _reversed_bits(code: int, length: int) -> int:
    """A Huffman code as deflate packs it: its first bit in the lowest position."""
    out = 0
    for _ in range(length):
        out = (out << 1) | (code & 1)
        code >>= 1
    return out


def _literal(value: int) -> Tuple[int, int]:
    """The fixed-Huffman code of a literal byte, packed, and its length."""
    if value < 144:
        return _reversed_bits(0x30 + value, 8), 8
    return _reversed_bits(0x190 + value - 144, 9), 9


#: The window given to a point whose window is empty (see ``decode``): one byte with a 9-bit code.
_UNREFERENCED = bytes([144])
#: An empty block with fixed codes: BFINAL 0, BTYPE 01, end of block (seven 0 bits).
_EMPTY_BLOCK = (0b010, 10)
#: Literals taken from the end of the window at most, looking for an odd number of 9-bit ones.
_MAX_LITERALS = 64


def _prefix(window: bytes, bits: int, top: int) -> Optional[Tuple[bytes, int]]:
    """Bytes that a raw deflate decoder reads as complete blocks and then the block that begins
    with the ``bits`` bits ``top``, so that the compressed bytes after it follow unshifted; and
    how many of the window's last bytes the blocks send (None: an odd number of bits is
    needed, and neither 9-bit literals nor a match at the window's end make one)."""
    need = (8 - bits) % 8  # the prefix's length in bits, modulo 8
    value = 0
    length = 0
    literals = 0
    if need % 2:
        nine = 0
        count = 0
        for count in range(1, min(len(window), _MAX_LITERALS) + 1):
            nine += window[-count] >= 144
            if nine % 2:
                break
        else:
            return _prefix_with_a_match(window, need, bits, top)
        literals = count
        value, length = _with_literals(0b010, 3, window[len(window) - count :])  # (fixed codes, not the last)
        length += 7  # end of block
    return _lined_up(value, length, need, bits, top), literals


def _with_literals(value: int, length: int, data: bytes) -> Tuple[int, int]:
    """The bits ``value`` (``length`` of them) followed by ``data`` as fixed-code literals."""
    for byte in data:
        code, size = _literal(byte)
        value |= code << length
        length += size
    return value, length


def _lined_up(value: int, length: int, need: int, bits: int, top: int) -> bytes:
    """The prefix's blocks (``length`` bits) and empty ones up to ``need`` bits modulo 8, then
    the first ``bits`` bits ``top`` of the stream's block: whole bytes."""
    while length % 8 != need:
        value |= _EMPTY_BLOCK[0] << length
        length += _EMPTY_BLOCK[1]
    value |= top << length
    length += bits
    return value.to_bytes(length // 8, "little")


#: Distance codes of deflate with an odd number of extra bits: (code, first distance, extra bits).
_ODD_DISTANCES = (
    (4, 5, 1),
    (5, 7, 1),
    (8, 17, 3),
    (9, 25, 3),
    (12, 65, 5),
    (13, 97, 5),
    (16, 257, 7),
    (17, 385, 7),
    (20, 1025, 9),
    (21, 1537, 9),
    (24, 4097, 11),
    (25, 6145, 11),
    (28, 16385, 13),
    (29, 24577, 13),
)
#: The length of the match that a prefix without 9-bit literals copies (length code 257: 7 bits).
_MATCH = 3


def _prefix_with_a_match(window: bytes, need: int, bits: int, top: int) -> Optional[Tuple[bytes, int]]:
    """``_prefix`` for an odd ``need`` when the window's end offers no odd number of 9-bit
    literals (text): a block with one match, whose distance has an odd number of extra bits (a
    match of length 3 is 7 + 5 + extra bits), and literals after it. With the window's last
    ``taken`` bytes taken off the dictionary, the match copies the first 3 of them from where
    they occur before and the literals send the rest, so that the history is the window again;
    their output is dropped. None when no such earlier occurrence is found."""
    for taken in range(_MATCH, min(len(window), _MAX_LITERALS) + 1):
        history = len(window) - taken  # the dictionary: the window without the bytes taken
        head = window[history : history + _MATCH]
        for code, base, extra in _ODD_DISTANCES:
            low, high = max(base, _MATCH), min(base + (1 << extra) - 1, history)
            if low > high:
                continue
            # An occurrence at ``history - distance`` for a distance in [low, high], copied from
            # the dictionary alone (distance >= 3).
            found = window.rfind(head, history - high, history - low + _MATCH)
            if found < 0:
                continue
            value, length = 0b010, 3  # a block with fixed codes, not the last
            value |= _reversed_bits(257 - 256, 7) << length  # length code 257: a match of 3
            length += 7
            value |= _reversed_bits(code, 5) << length
            length += 5
            value |= (history - found - base) << length  # (extra bits go in as they are)
            length += extra
            value, length = _with_literals(value, length, window[history + _MATCH :])
            length += 7  # end of block
            if length % 2 != need % 2:
                break  # (an even number of 9-bit literals in the rest: try taking more)
            return _lined_up(value, length, need, bits, top), taken
    return None
