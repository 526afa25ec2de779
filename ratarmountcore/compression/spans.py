"""A bounded cache of decoded spans between consecutive seek points.

Reading one small member of a compressed archive means decoding from the seek point before it.
Libraries keep some decoded chunks themselves, but per decoder instance and with their own
limits and read-ahead (rapidgzip keeps a handful of chunks per reader and prefetches more); with
a few decoders in a pool, random reads of small members kept decoding the same spans again. Here
the span ``[start, next seek point)`` that holds a read is decoded once, as a whole, and kept in
a per-file LRU bounded in bytes, so that later reads anywhere in it are a copy.

The bound holds per process too: all caches share one LRU of spans, limited to the largest
capacity any of them was given, so a union mount of 200 compressed archives keeps at most that
much decoded data in all (not 200 times it).

Concurrent misses on the same span decode it once: the first thread decodes, the others wait
for its result (or its failure, after which they try themselves). Decode errors are never
cached, so corrupt data keeps failing the reads that touch it.

A miss may decode only the start of its span, up to the end of the read (``decode(start, stop,
need)`` returns at least ``need - start`` bytes, at most the span; see ``deflate_resume.py``):
that part is cached, and a later read further into the span decodes it whole. (Decoding it
only further again made a sequential reader of small members decode each span from its start
once per member: every file of the 100,000-file .tar.gz read in order took 42 s instead of
~20 s.)
"""

from __future__ import annotations

import bisect
import collections
import threading
import weakref
from typing import Callable, Dict, List, Optional, Tuple

from ..io import forks
from .expected import Competition, Expectation

#: ``decode(start, stop, need)``: the span's bytes from ``start``, at least up to ``need`` (fewer
#: only at the end of the data), at most up to ``stop``.
Decode = Callable[[int, int, int], bytes]


#: Streams whose data together is more than the process's bound, but at most this many times
#: it, are kept whole (``_ProcessBudget.bound``). A folder of 100 class .tar.gz of 0.68 MB (68
#: MB, the bound 32 MiB) read at random decoded each part of a span 2.6 times on average, the
#: bound's LRU evicting what was read again soon after: 1,000 random reads through the mount
#: 0.95-1.2 s, the peer 0.51-0.56 s (holding all of it, peak RSS 125 MiB). One stream as well
#: (session 43): a 68 MB .tar.bz2, 1,000 random reads, each miss decoding a 900 kB block, 19 s.
#: Larger sets (ImageNet's 1,000 class .tar.gz, 140 GB) keep the bound: there, more memory
#: would buy no hits.
GROWTH = 3
#: What the cache of a stream that only holds compressed archives keeps (``transit``; its own
#: larger spans aside): their decoders read its spans in pieces, each span once per decode.
TRANSIT_LIMIT = 4 << 20


class _ProcessBudget(Competition):
    """LRU of the spans of all caches of the process. Its lock is never held together with a
    cache's lock."""

    def __init__(self) -> None:
        super().__init__()
        self._lru: "collections.OrderedDict[Tuple[int, int], Tuple[weakref.ref[SpanCache], int]]" = (
            collections.OrderedDict()
        )
        self.bytes = 0
        #: The largest capacity given to any cache: the bound for the whole process.
        self.budget = 0
        #: The decompressed sizes of the streams of all live caches together: what reads all
        #: over the process's compressed data compete for (``shares_beyond_budget``).
        self.streams = 0
        #: How many streams those are.
        self.count = 0

    def stream_opened(self, size: int) -> None:
        with self._lock:
            self.streams += size
            self.count += 1

    def stream_closed(self, size: int) -> None:
        with self._lock:
            self.streams -= size
            self.count -= 1

    def competing(self) -> int:
        """The decompressed sizes of the streams open and expected together (at least what
        competed in the parent, in a forked child)."""
        return self._with_counted(self.streams)

    def bound(self) -> int:
        """What the process keeps: the largest capacity given (``budget``); all the data of its
        streams (one archive, a folder or union of small ones) where that is at most ``GROWTH``
        times it."""
        streams = self.competing()
        if self.budget < streams <= GROWTH * self.budget:
            return streams
        return self.budget

    def touch(self, cache: "SpanCache", start: int) -> None:
        with self._lock:
            key = (id(cache), start)
            if key in self._lru:
                self._lru.move_to_end(key)

    def add(self, cache: "SpanCache", start: int, size: int) -> None:
        victims = []
        with self._lock:
            key = (id(cache), start)
            old = self._lru.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            self._lru[key] = (weakref.ref(cache), size)
            self.bytes += size
            bound = self.bound()
            while self.bytes > bound and len(self._lru) > 1:
                (_, victim_start), (ref, victim_size) = self._lru.popitem(last=False)
                self.bytes -= victim_size
                victims.append((ref, victim_start))
        for ref, victim_start in victims:
            owner = ref()
            if owner is not None:
                owner._drop(victim_start)

    def forget(self, cache: "SpanCache", starts: List[int]) -> None:
        with self._lock:
            for start in starts:
                entry = self._lru.pop((id(cache), start), None)
                if entry is not None:
                    self.bytes -= entry[1]


_PROCESS = _ProcessBudget()


def _new_budget_in_child() -> None:
    global _PROCESS
    parent = _PROCESS
    _PROCESS = _ProcessBudget()  # the parent's caches are parked there (io/forks.py)
    # What competed in the parent competes in the child from the start (``Competition``). Each
    # of two workers reading a folder of 1,000 class .tar.gz grew by 145 MiB, its caches keeping
    # all while fewer than three caches' worth had been read.
    _PROCESS.inherited = parent.competing()


forks.in_child(_new_budget_in_child)


def expect_stream(size: int) -> Expectation:
    """A stream of ``size`` decompressed bytes counted among the process's streams before its
    span cache counts it (at its first read): withdrawn then, or at close."""
    return Expectation(_PROCESS, size)


def kept_whole(cache: "SpanCache") -> bool:
    """Whether all of ``cache``'s stream, with the other streams of the process, fits what the
    process keeps (``_ProcessBudget.bound``)."""
    process = _PROCESS
    return cache.size <= cache.limit and process.competing() <= process.bound()


def shares_beyond_budget(cache: "SpanCache") -> bool:
    """Whether ``cache``'s stream is one of several (a recursive mount's inner archives, a
    union's archives) whose decompressed sizes together are more than the process keeps."""
    process = _PROCESS
    return process.competing() > max(cache.size, process.bound())


class SpanCache:
    def __init__(self, starts: List[int], size: int, capacity: int, transit: bool = False) -> None:
        """``starts``: decompressed offsets of the seek points; ``size``: decompressed size.
        ``transit``: the stream holds compressed archives (nearly) only, read by their own
        decoders, whose caches keep what they decode (``CompressedReader.serves_nested``): it
        keeps a few spans and does not count among the streams that compete for the process's
        bound (a .tar.gz of 100 class .tar.gz counted twice, the bound held a third of them)."""
        points = sorted({s for s in starts if 0 <= s < size} | {0})
        self._starts = points
        self._ends = points[1:] + [size]
        self.size = size
        self.capacity = capacity
        #: What this cache keeps: its capacity, or all of its stream when that is at most
        #: ``GROWTH`` times it (the process's bound decides among several streams).
        self.limit = size if size <= GROWTH * capacity else capacity
        counted = size
        self.transit = transit
        if transit:
            largest = max(e - s for s, e in zip(self._starts, self._ends))
            self.limit = min(self.limit, max(TRANSIT_LIMIT, 2 * largest))
            counted = 0
        _PROCESS.budget = max(_PROCESS.budget, capacity)
        _PROCESS.stream_opened(counted)
        #: Takes the stream out of the process's sum (once: at ``close`` or when collected).
        self._uncount = weakref.finalize(self, _PROCESS.stream_closed, counted)
        #: Spans longer than this are not cached (the caller reads them directly).
        self.max_span = max(1, capacity // 4)
        self._all_cacheable = max(e - s for s, e in zip(self._starts, self._ends)) <= self.max_span
        self._lock = threading.Lock()
        self._spans: "collections.OrderedDict[int, bytes]" = collections.OrderedDict()
        #: The spans cached whole (the others hold the part up to the end of the read that decoded them).
        self._whole: "set[int]" = set()
        self._bytes = 0
        self._pending: Dict[int, threading.Event] = {}
        self.hits = 0
        self.misses = 0
        self.decoded_bytes = 0

    def span_of(self, offset: int) -> Tuple[int, int]:
        i = bisect.bisect_right(self._starts, offset) - 1
        return self._starts[i], self._ends[i]

    def covers(self, offset: int, size: int) -> bool:
        """True when the cache serves ``[offset, offset + size)``: a read no longer than the
        largest cacheable span, touching only spans small enough to cache."""
        if offset < 0 or size > self.max_span:
            return False
        if self._all_cacheable:
            return True
        end = min(offset + size, self.size)
        while offset < end:
            start, stop = self.span_of(offset)
            if stop - start > self.max_span:
                return False
            offset = stop
        return True

    def read(self, offset: int, size: int, decode: Decode) -> bytes:
        """Bytes ``[offset, offset + size)`` (fewer at the end of the data); ``decode`` produces
        (a part of) a span on a miss."""
        end = min(offset + size, self.size)
        pieces: List[bytes] = []
        while offset < end:
            start, stop = self.span_of(offset)
            data = self._get(start, stop, min(end, stop), decode)
            piece = data[offset - start : min(end, stop) - start]
            if not piece:
                break  # the span decoded shorter than expected: end of the data
            pieces.append(piece)
            offset += len(piece)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def readinto(self, offset: int, view: memoryview, decode: Decode) -> int:
        """Like ``read`` into ``view``: each span's bytes are copied once, straight into place."""
        end = min(offset + len(view), self.size)
        done = 0
        while offset < end:
            start, stop = self.span_of(offset)
            data = self._get(start, stop, min(end, stop), decode)
            count = min(end, stop, start + len(data)) - offset
            if count <= 0:
                break  # the span decoded shorter than expected: end of the data
            view[done : done + count] = memoryview(data)[offset - start : offset - start + count]
            done += count
            offset += count
        return done

    def _get(self, start: int, stop: int, need: int, decode: Decode) -> bytes:
        while True:
            with self._lock:
                data = self._spans.get(start)
                hit = data is not None and (start + len(data) >= need or start in self._whole)
                if hit:
                    self._spans.move_to_end(start)
                    self.hits += 1
                else:
                    if data is not None:
                        need = stop  # a part, and more is read: the span is read further (in order)
                    event = self._pending.get(start)
                    if event is None:
                        event = self._pending[start] = threading.Event()
                        self.misses += 1
                        break
            if hit:
                assert data is not None
                _PROCESS.touch(self, start)
                return data
            # Another thread decodes this span; then look again. (Until session 30 a part
            # cached short of the read was returned here: a short read, which the gzip reader
            # reported as damage. Found by fuzzing with concurrent readers.)
            assert event is not None
            event.wait()
        try:
            data = decode(start, stop, need)
        except BaseException:
            with self._lock:
                del self._pending[start]
            event.set()
            raise
        evicted = []
        with self._lock:
            del self._pending[start]
            self.decoded_bytes += len(data)
            self._keep(start, data, start + len(data) >= stop or start + len(data) < need)
            while self._bytes > self.limit and len(self._spans) > 1:
                old_start, old = self._spans.popitem(last=False)
                self._bytes -= len(old)
                self._whole.discard(old_start)
                evicted.append(old_start)
        event.set()
        _PROCESS.forget(self, evicted)
        if not self.transit:
            _PROCESS.add(self, start, len(data))
        return data

    def _keep(self, start: int, data: bytes, whole: bool) -> None:
        """(Under the lock.) ``data`` as the span at ``start`` (replacing a shorter part of it);
        ``whole``: all there is of the span (the span, or what the data holds before its end)."""
        old = self._spans.pop(start, None)
        if old is not None:
            self._bytes -= len(old)
        self._spans[start] = data
        self._bytes += len(data)
        if whole:
            self._whole.add(start)
        else:
            self._whole.discard(start)

    def spans_within(self, low: int, high: int) -> List[Tuple[int, int]]:
        """The spans ``(start, end)`` that lie in ``[low, high)``."""
        i = bisect.bisect_left(self._starts, low)
        out = []
        while i < len(self._starts) and self._ends[i] <= high:
            out.append((self._starts[i], self._ends[i]))
            i += 1
        return out

    def wanted(self, start: int) -> bool:
        """Whether the span at ``start`` is neither cached whole nor being decoded."""
        with self._lock:
            return start not in self._whole and start not in self._pending

    def offer(self, start: int, data: bytes) -> bool:
        """Keep ``data`` as the span that begins at ``start``, decoded by someone not asked for it
        (see ``PooledReader._warm_all``), unless the span is cached or being decoded already, or
        the bytes are not the whole span. True when kept."""
        i = bisect.bisect_left(self._starts, start)
        if i >= len(self._starts) or self._starts[i] != start or len(data) != self._ends[i] - start:
            return False
        with self._lock:
            part = self._spans.get(start)
            more = len(data) - (len(part) if part is not None else 0)
            if start in self._whole or start in self._pending or self._bytes + more > self.limit:
                return False
            self._keep(start, data, True)
            self._spans.move_to_end(start, last=False)  # (not used yet: first to go)
            self.decoded_bytes += len(data)
        _PROCESS.add(self, start, len(data))
        return True

    def _drop(self, start: int) -> None:
        """Evicted by the process-wide bound."""
        with self._lock:
            data = self._spans.pop(start, None)
            self._whole.discard(start)
            if data is not None:
                self._bytes -= len(data)

    def clear(self) -> None:
        with self._lock:
            starts = list(self._spans)
            self._spans.clear()
            self._whole.clear()
            self._bytes = 0
        _PROCESS.forget(self, starts)

    def close(self) -> None:
        """Drop everything; the stream no longer counts among the process's streams (which
        decide whether streams share the bound: ``shares_beyond_budget``). A reader's caches
        were counted until collected, and a closed union's archives made the next one's
        streams seem to share it."""
        self.clear()
        self._uncount()

    @property
    def cached_bytes(self) -> int:
        return self._bytes


def optional_cache(starts: Optional[List[int]], size: int, capacity: int, transit: bool = False) -> Optional[SpanCache]:
    if not starts or capacity <= 0:
        return None
    return SpanCache(starts, size, capacity, transit)
