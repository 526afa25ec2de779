"""Compressed streams that will be read, counted before their caches count them.

``Competition`` is what both caches share for this (``expected``, ``inherited``), and
``Expectation`` one announcement of bytes to come: a folder's or union's archive asked to count
before its first read (``spans.expect_stream``), or the inner archives below.

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
from typing import Dict, Mapping, Optional, Tuple

from ..formats import FormatId

logger = logging.getLogger(__name__)

#: The index metadata key: JSON ``{format id: [compressed bytes, decompressed bytes]}`` of the
#: inner archives.
METADATA_KEY = "nested_decoded"

#: Compressed and decompressed bytes of a format's inner streams.
Sizes = Mapping[FormatId, Tuple[int, int]]


class Competition:
    """What the reads of one cache of decoded data compete for besides the streams it counts
    itself (the base of ``spans._ProcessBudget`` and ``framed.FrameCache``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: The decompressed sizes of streams that will be read and that the cache does not count
        #: yet (``Expectation``): an archive's compressed inner archives not opened yet, archives
        #: asked to count before their first read.
        self.expected = 0
        #: In a forked child: what competed in the parent at the fork (the child reads the
        #: parent's archives, a DataLoader's workers, opening their streams anew as it reads).
        self.inherited = 0

    def expect(self, delta: int) -> None:
        """``expected`` grows by ``delta`` (shrinks, when negative)."""
        with self._lock:
            self.expected = max(0, self.expected + delta)

    def _with_counted(self, counted: int) -> int:
        """``counted`` bytes of the cache's own streams, with the expected ones (at least the
        parent's total, in a forked child)."""
        return max(self.inherited, counted + self.expected)


class Expectation:
    """``size`` bytes counted in a ``Competition``'s ``expected`` until taken back: in parts as
    the streams open (``take``), the rest at close (``withdraw``); from any thread."""

    def __init__(self, competition: Competition, size: int) -> None:
        self._competition = competition  # (a forked child's caches have a competition of their own)
        self._lock = threading.Lock()
        self.left = max(0, size)
        competition.expect(self.left)

    def take(self, size: int) -> None:
        with self._lock:
            taken = min(self.left, max(0, size))
            self.left -= taken
        if taken:
            self._competition.expect(-taken)

    def withdraw(self) -> None:
        self.take(self.left)


def _competition(fmt: FormatId) -> Optional[Competition]:
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
    return {fmt: pair for fmt, pair in sizes.items() if min(pair) > 0 and _competition(fmt) is not None}


def format_sizes(sizes: Mapping[str, Tuple[int, int]]) -> str:
    return json.dumps({fmt: list(pair) for fmt, pair in sorted(sizes.items())})


class ExpectedStreams:
    """The decompressed sizes of one archive's inner streams not opened yet, counted in the
    caches' totals until each opens (``opened``) or the archive closes (``withdraw``)."""

    def __init__(self, sizes: Sizes) -> None:
        #: Per format: what is expected, and the decompressed bytes of a compressed one.
        self._parts: Dict[FormatId, Tuple[Expectation, float]] = {}
        for fmt, (compressed, decoded) in sizes.items():
            competition = _competition(fmt)
            if competition is not None and compressed > 0 and decoded > 0:
                self._parts[fmt] = (Expectation(competition, decoded), decoded / compressed)

    def opened(self, fmt: FormatId, compressed: int) -> None:
        """A stream of ``fmt`` of ``compressed`` bytes is open now and counts itself once read."""
        part = self._parts.get(fmt)
        if part is not None:
            part[0].take(round(compressed * part[1]))

    def withdraw(self) -> None:
        """The archive is closed: what was not opened is expected no more."""
        for expectation, _ratio in self._parts.values():
            expectation.withdraw()

    @property
    def left(self) -> int:
        return sum(expectation.left for expectation, _ratio in self._parts.values())
