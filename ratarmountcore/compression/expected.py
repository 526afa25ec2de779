"""Compressed streams an archive will open later, counted before they are opened.

Both caches of decoded data (``spans.py`` for gzip and bzip2, ``framed.py``'s frame cache for
xz and zstd) decide from the decompressed sizes of the streams that compete for them whether to
keep all of it (up to three caches) or to stay within their bound. An uncompressed tar of
compressed tars mounted with ``-r`` (ImageNet's train tar with its class archives compressed)
opens each inner stream on its first read, so those sizes used to be counted as the reads came:
while fewer than three caches' worth were open the caches kept everything, then fell back to
their bound. A tar of 1,000 class .tar.gz (339 MB decoded), 1,000 random reads: peak RSS
135-143 MiB in process, where the bound alone holds ~70. The index records how much its inner
streams of each format take compressed and decompressed (``nested_decoded`` in its metadata),
and the archive's source announces the decompressed sizes at open (``ExpectedStreams``). Each
stream, when opened, takes its share out of the announcement (its compressed size times its
format's ratio: the index keeps totals, not a size per stream, so that older indexes stay valid)
and counts as any open stream does once read.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Dict, Mapping, Optional, Protocol, Tuple

from ..formats import FormatId

logger = logging.getLogger(__name__)

#: The index metadata key: JSON ``{format id: [compressed bytes, decompressed bytes]}`` of the
#: inner archives.
METADATA_KEY = "nested_decoded"

#: Compressed and decompressed bytes of a format's inner streams.
Sizes = Mapping[FormatId, Tuple[int, int]]


class _Counter(Protocol):
    def expect(self, delta: int) -> None: ...


def _counter(fmt: FormatId) -> Optional[_Counter]:
    """The process's count that streams of ``fmt`` compete in (looked up at call time: a forked
    child has counts of its own)."""
    if fmt in (FormatId.GZIP, FormatId.BZIP2):
        from . import spans

        return spans._PROCESS
    if fmt in (FormatId.XZ, FormatId.ZSTD):
        from . import framed

        return framed.FRAME_CACHE
    return None


def parse_sizes(value: Optional[str]) -> Dict[FormatId, Tuple[int, int]]:
    """The sizes stored under ``METADATA_KEY`` (none for an index without them, or with unknown
    formats or a value not understood: the streams are then counted as they open, as before)."""
    if not value:
        return {}
    try:
        sizes = {FormatId(key): (int(pair[0]), int(pair[1])) for key, pair in json.loads(value).items()}
    except (ValueError, TypeError, AttributeError, IndexError, KeyError):
        logger.debug("ignoring the index's %s value %r", METADATA_KEY, value)
        return {}
    return {fmt: pair for fmt, pair in sizes.items() if min(pair) > 0 and _counter(fmt) is not None}


def format_sizes(sizes: Mapping[str, Tuple[int, int]]) -> str:
    return json.dumps({fmt: list(pair) for fmt, pair in sorted(sizes.items())})


class ExpectedStreams:
    """The decompressed sizes of one archive's inner streams not opened yet, counted in the
    caches' totals until each opens (``opened``) or the archive closes (``withdraw``)."""

    def __init__(self, sizes: Sizes) -> None:
        self._lock = threading.Lock()
        self._left: Dict[FormatId, int] = {}
        self._ratios: Dict[FormatId, float] = {}
        self._counters: Dict[FormatId, _Counter] = {}
        for fmt, (compressed, decoded) in sizes.items():
            counter = _counter(fmt)
            if counter is not None and compressed > 0 and decoded > 0:
                counter.expect(decoded)
                self._left[fmt] = decoded
                self._ratios[fmt] = decoded / compressed
                self._counters[fmt] = counter

    def opened(self, fmt: FormatId, compressed: int) -> None:
        """A stream of ``fmt`` of ``compressed`` bytes is open now and counts itself once read."""
        with self._lock:
            left = self._left.get(fmt, 0)
            taken = min(left, max(0, round(compressed * self._ratios.get(fmt, 0.0))))
            if taken:
                self._left[fmt] = left - taken
        if taken:
            self._counters[fmt].expect(-taken)

    def withdraw(self) -> None:
        """The archive is closed: what was not opened is expected no more."""
        with self._lock:
            left, self._left = self._left, {}
        for fmt, size in left.items():
            if size:
                self._counters[fmt].expect(-size)

    @property
    def left(self) -> int:
        with self._lock:
            return sum(self._left.values())
