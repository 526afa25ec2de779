"""Shared logic of backends whose library decoder is a seekable file object (rapidgzip for gzip
and bzip2, indexed_gzip).

Thread safety: a bounded ``InstancePool`` of decoders (see ``pool.py``). Each decoder reads the
compressed file through its own ``FdFile`` over the one shared descriptor. Decoders created after
``import_seek_points`` load the stored seek points first, so none of them ever decompresses from
the start to reach a late offset. Memory is bounded by ``max_instances`` decoders.
"""

from __future__ import annotations

import atexit
import collections
import logging
import threading
import time
import weakref
from abc import abstractmethod
from typing import Any, Callable, ClassVar, List, Optional, Tuple, Union

from ..cores import DEFAULT_DECODER_THREADS, usable_cores
from ..errors import CorruptDataError, TruncatedArchiveError
from ..io import forks
from ..io.proc_io import ReadCounter
from ..options import CompressionOptions
from .base import (
    CompressedReader,
    FdFile,
    PlainFile,
    SeekPointSource,
    SeekPointWriter,
    pack_seek_points,
    read_fully,
    unpack_seek_points,
)
from .expected import Expectation
from .pool import InstancePool, Slot
from .spans import SpanCache, expect_stream, kept_whole, optional_cache, shares_beyond_budget

logger = logging.getLogger(__name__)

#: Reads at least this large bypass the span cache and decode straight into the caller's buffer.
DIRECT_READ_MIN = 128 * 1024
#: Span-cache misses decode only the part of their span that the read needs (where the
#: backend can) in streams at least this many times the cache, and in streams that share the
#: process's one bound with others when all together are more than it (see ``_decode_span``).
PARTS_MIN_FACTOR = 2
#: The readers open in the process (a stream is decoded whole only by the only one).
_OPEN: "weakref.WeakSet[PooledReader]" = weakref.WeakSet()


@atexit.register
def _close_open_at_exit() -> None:
    """A program that exits without closing its sources: stop the background decoding first.
    rapidgzip aborts the process (SIGABRT) when the interpreter finalizes under one of its
    threads (1 in 2 runs of 20 random reads of a .tar.gz, then exit)."""
    for reader in list(_OPEN):
        reader.close()


def _forget_open_in_child() -> None:
    global _OPEN
    _OPEN = weakref.WeakSet()  # the parent's readers are parked in a child (io/forks.py)


forks.in_child(_forget_open_in_child)


#: The queue's sleep after each span it decodes ahead (see ``_warm_all``): the union of 100
#: class .tar.gz, `find` right after the mount 0.064 s without the queue, 0.115 s with it and no
#: sleep, 0.077-0.117 s with 1 ms (its 1,000 random reads 0.29-0.35 s; 0.64 s without the queue).
WARM_PAUSE = 0.001


class _WarmJob:
    """One reader's stream to decode whole into its span cache, in the queue's thread."""

    def __init__(self, reader: "PooledReader", spans: Optional[SpanCache], size: int) -> None:
        self.reader = weakref.ref(reader)
        self.spans = spans
        self.size = size
        self._lock = threading.Lock()
        self._state = "queued"  # -> "running" -> "done", or "cancelled" before it ran
        self._done = threading.Event()
        #: The process's fork generation: in a child, no thread of the queue runs it.
        self._generation = forks.generation

    def run(self) -> None:
        with self._lock:
            if self._state != "queued":
                self._done.set()
                return
            self._state = "running"
        try:
            reader = self.reader()
            if reader is None or reader._closing:
                return
            spans = self.spans if self.spans is not None else reader._spans_of_seek_points()
            if spans is None:  # (the span starts come from a decoder: the first miss may ask again)
                with reader._warm_lock:
                    if reader._warm is self:
                        reader._warm = None
                return
            # (Asked again: archives opened since may have made the streams too many.)
            if kept_whole(spans):
                reader._warm_all(spans, self.size, WARM_PAUSE)
        finally:
            with self._lock:
                self._state = "done"
            self._done.set()

    def cancel_or_wait(self, timeout: float) -> None:
        """At the reader's close: the job does not run, or has ended (after at most one span)."""
        with self._lock:
            if self._state == "queued":
                self._state = "cancelled"
            if self._state != "running" or self._generation != forks.generation:
                return
        self._done.wait(timeout)


class _WarmQueue:
    """Streams of several readers (a folder's or a union's archives, or one archive of up to
    three caches) decoded whole one after another by one thread: a thread each would be
    thousands for a folder of small archives."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: "collections.deque[_WarmJob]" = collections.deque()
        self._thread: Optional[threading.Thread] = None

    def add(self, job: _WarmJob) -> None:
        with self._lock:
            self._jobs.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ratarmount-warm-queue", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._jobs:
                    self._thread = None
                    return
                job = self._jobs.popleft()
            try:
                job.run()
            except Exception as exc:  # noqa: BLE001 - a hint: reads decode what they need themselves
                logger.debug("decoding ahead stopped: %s", exc)  # (the thread goes on with the next)


_WARM_QUEUE = _WarmQueue()


def _new_warm_queue_in_child() -> None:
    global _WARM_QUEUE
    _WARM_QUEUE = _WarmQueue()  # (the parent's thread is not in the child)


forks.in_child(_new_warm_queue_in_child)


class PooledReader(CompressedReader):
    #: Upper bound of decoders alive at once (each may run its own worker threads).
    max_instances: ClassVar[int] = 4
    #: Whether the decoders' threads together must not outnumber the cores (fewer decoders when
    #: each runs one thread per core): for libraries whose parallel decoder works on speculation
    #: that two of them at once turn into thrashing (see ``bzip2.py``).
    threads_within_cores: ClassVar[bool] = False
    #: Finish (fully decompress and verify) the first decoder as soon as it is created, before any
    #: read (for libraries that only verify checksums while building their complete index).
    finish_on_create: ClassVar[bool] = False
    #: Threads of the decoders that fill the span cache (small reads), when they should differ
    #: from ``parallelization`` (None: the same decoders serve both). A parallel decoder
    #: speculatively decodes the spans after the one asked for; for reads all over the file
    #: that work is wasted (see ``docs/design.md``).
    span_decoder_threads: ClassVar[Optional[int]] = None
    #: Whether the library reads the compressed file roughly as far as it has decoded (so that
    #: the bytes read tell a first pass's progress); not so for rapidgzip's bzip2 reader, whose
    #: block finder runs through the whole file early.
    reads_in_step: ClassVar[bool] = True
    #: Threads per core of the parallel decoders when the user leaves ``-P`` at its default.
    default_oversubscription: ClassVar[int] = 1
    #: Whether the decoders run threads that call into Python (rapidgzip's take the GIL to read
    #: the file): they are closed before a fork (``InstancePool(close_before_fork=...)``).
    threads_call_python: ClassVar[bool] = False

    def __init__(self, path: str, plain: PlainFile, options: CompressionOptions) -> None:
        super().__init__(path, plain, options)
        self._size: Optional[int] = None
        #: True once the end of the stream is known to be intact (or trusted from the index).
        self._end_checked = False
        self._payload_loader: Optional[Callable[[], bytes]] = None
        self._finish_lock = threading.Lock()
        #: Decoded spans between seek points, once the seek points are known (see ``spans.py``).
        self._spans: Optional[SpanCache] = None
        #: Whether ``_spans_of_seek_points`` was asked (once).
        self._spans_asked = False
        #: The stream, counted among the process's streams until its span cache counts it
        #: (``count_before_reads``); it and ``_spans`` are set under ``_pending_lock``.
        self._pending: Optional[Expectation] = None
        self._pending_lock = threading.Lock()
        #: The stream holds compressed archives only (``serves_nested``), set before its cache.
        self._transit = False
        #: The thread decoding the whole stream into the span cache (see ``_warm_all``), or its
        #: job in the queue of several readers; False once it was decided that there is none.
        self._warm: Union[None, bool, threading.Thread, _WarmJob] = None
        self._warm_lock = threading.Lock()
        #: The thread that starts it when asked before any read (``decode_ahead``).
        self._starter: Optional[threading.Thread] = None
        self._closing = False
        _OPEN.add(self)
        #: Compressed bytes read so far (decided at the first ``compressed_progress``).
        self._reads: Optional[Callable[[], int]] = None
        count = min(self.max_instances, max(1, options.threads()))
        threads = options.threads()
        if self.threads_within_cores:
            count = max(1, min(count, usable_cores() // threads))
        if options.parallelization <= 0:  # (more threads than cores, within the default's bound)
            threads = min(threads * self.default_oversubscription, max(threads, DEFAULT_DECODER_THREADS))
        #: Threads of a decoder that scans the stream before the seek points are known (the
        #: first mount); a backend may lower it once it knows what the archive holds.
        self._scan_threads = threads
        span_threads = self.span_decoder_threads
        separate = span_threads is not None and span_threads != threads
        #: Decoders for scans and large reads (with the coarse seek points when there are two pools).
        self._pool: InstancePool[Any] = InstancePool(
            lambda: self._new_slot(threads, coarse=separate, scans=True),
            self._close_decoder,
            count,
            close_before_fork=self.threads_call_python,
            weight=threads,
        )
        #: Decoders for span-cache misses (the same pool unless ``span_decoder_threads`` differs).
        self._span_pool: InstancePool[Any] = (
            InstancePool(
                lambda: self._new_slot(span_threads or 1),
                self._close_decoder,
                count,
                close_before_fork=self.threads_call_python,
                weight=span_threads or 1,
            )
            if separate
            else self._pool
        )

    # --- backend hooks ------------------------------------------------------------------------
    @abstractmethod
    def _open_decoder(self, raw: Union[str, FdFile], threads: int) -> Any:
        """A new library decoder reading ``raw`` (a path or a file object, see ``library_source``),
        decoding with up to ``threads`` threads where the library can."""

    def _coarse_seek_points(self, payload: bytes) -> Optional[bytes]:
        """The stored seek points thinned out for the decoders of scans and large reads (None:
        use them all). Span-cache misses want seek points close together (each miss decodes
        from one to the next); parallel decoders may work better with fewer."""
        return None

    @abstractmethod
    def _load_seek_points(self, decoder: Any, payload: bytes) -> None:
        """Give ``decoder`` the seek points exported by ``_export``."""

    @abstractmethod
    def _finish(self, decoder: Any) -> int:
        """Decompress to the end (verifying what the format allows), so that the decoder's seek
        points are complete; check that the stream is not truncated; return the size."""

    @abstractmethod
    def _export(self, decoder: Any) -> bytes:
        """The complete seek points of a finished decoder."""

    def _span_starts(self, decoder: Any) -> Optional[List[int]]:
        """Decompressed offsets of the seek points of a complete decoder (None: unknown)."""
        return None

    def _close_decoder(self, decoder: Any) -> None:
        decoder.close()

    def _learn_spans(self, decoder: Any) -> None:
        if self._spans is not None or self._size is None or self.options.cache_size <= 0:
            return
        with self.data_errors():
            starts = self._span_starts(decoder)
        self._make_spans(starts, self._size)

    def compressed_progress(self) -> Optional[int]:
        if not self.reads_in_step:
            return None
        if self._reads is None:
            # Decoders given a path read the file in C, past our counters: ask the kernel.
            by_path = isinstance(self.library_source(), str)
            self._reads = ReadCounter() if by_path else lambda: self.stats.compressed_bytes_read
        return min(self.compressed_size, self._reads())

    # --- pool ---------------------------------------------------------------------------------
    def _pools(self) -> Tuple[InstancePool[Any], ...]:
        return (self._pool,) if self._span_pool is self._pool else (self._pool, self._span_pool)

    def _new_slot(self, threads: int, coarse: bool = False, scans: bool = False) -> Slot[Any]:
        """A decoder with ``threads`` threads (``_scan_threads`` when it ``scans`` a stream whose
        seek points are not known yet), given the coarse seek points when ``coarse``."""
        loader = self._payload_loader
        if loader is None and scans:
            threads = self._scan_threads
        with self.data_errors():
            decoder = self._open_decoder(self.library_source(), threads)
        self.stats.decoders_created += 1
        slot: Slot[Any] = Slot(decoder)
        try:
            if loader is not None:
                payload = loader()
                if coarse:
                    payload = self._coarse_seek_points(payload) or payload
                with self.data_errors():
                    self._load_seek_points(decoder, payload)
                slot.complete = True
                if not coarse:  # the span starts are the full set of seek points
                    self._learn_spans(decoder)
            elif self.finish_on_create and self._size is None:
                self._ensure_finished(slot)
        except BaseException:
            self._close_decoder(decoder)
            raise
        return slot

    def _ensure_finished(self, slot: Slot[Any]) -> int:
        with self._finish_lock:
            if not slot.complete or self._size is None:
                with self.data_errors():
                    try:
                        size = self._finish(slot.instance)
                    except TruncatedArchiveError as exc:
                        if self._size is None:
                            raise  # the first pass: the archive is truncated
                        # A read: the data ends before the end the index records (an OSError).
                        raise CorruptDataError(f"{exc} (the index records {self._size} bytes)") from exc
                slot.complete = True
                slot.position = -1  # unknown: seek before the next read
                if self._size is not None and self._size != size:
                    logger.warning("%s: decompressed size changed from %d to %d", self.path, self._size, size)
                self._size = size
                self._end_checked = True
                self._learn_spans(slot.instance)
            return self._size

    # --- CompressedReader ---------------------------------------------------------------------
    def pread(self, offset: int, size: int) -> bytes:
        if size <= 0 or offset < 0:
            return b""
        known = self._size
        if known is not None:
            if offset >= known:
                return b""
            size = min(size, known - offset)
            spans = self._spans
            if spans is None and self._payload_loader is not None:
                spans = self._spans_of_seek_points()
            if spans is not None and spans.covers(offset, size):
                return spans.read(offset, size, self._decode_span)
        return self._pread_direct(offset, size, self._pool_for(size))

    def _pool_for(self, size: int) -> InstancePool[Any]:
        """Small reads before the span cache exists (the first read after a mount, which makes
        the decoder that tells the span starts) go to the span decoders once the seek points
        are known; everything else, the first mount's scan included, to the parallel ones."""
        if size < DIRECT_READ_MIN and self._payload_loader is not None:
            return self._span_pool
        return self._pool

    def preadinto(self, offset: int, view: memoryview) -> int:
        spans = self._spans
        if len(view) < DIRECT_READ_MIN:
            if spans is not None and spans.covers(offset, len(view)):
                return spans.readinto(offset, view, self._decode_span)
            if spans is None and self._payload_loader is not None:
                data = self.pread(offset, len(view))
                view[: len(data)] = data
                return len(data)
        known = self._size
        if known is None or offset < 0:
            return super().preadinto(offset, view)
        # Large reads (a big member read through the kernel's read-ahead) skip the cache: it
        # would only add a copy, and the decoder then reads ahead in parallel for the next one.
        size = min(len(view), max(0, known - offset))
        if size <= 0:
            return 0
        with self._pool.acquire(offset, end=offset + size) as slot:
            decoder = slot.instance
            done = 0
            with self.data_errors():
                if slot.position != offset:
                    decoder.seek(offset)
                while done < size:
                    count = decoder.readinto(view[done:size])
                    if not count:
                        break
                    done += count
            slot.position = offset + done
            if done < size and not self._end_checked:
                self._ensure_finished(slot)
        return done

    def _decode_span(self, start: int, end: int, need: int) -> bytes:
        """The span ``[start, end)`` between two seek points, or its start up to ``need`` at least
        (see ``spans.py``): only that part when the stream is at least ``PARTS_MIN_FACTOR``
        times the cache (its spans are rarely read twice before they are evicted; in a stream
        the cache holds, reading the members in random order decoded twice the data that
        whole spans did), or when it is one of several streams that together are more than
        the process keeps (``spans.py``: one bound for all caches). The inner .tar.gz of a
        recursive mount are each smaller than the cache but compete for it: 100 inner archives
        of 0.66 MB, 1,000 random reads, 1.51-1.61 s decoding whole spans, 1.15-1.31 s decoding
        parts; 60 of them, 1.2 times the cache, about the same either way. Never when the
        process keeps all of the stream (``spans.kept_whole``): then each span is decoded once."""
        if self._warm is None:
            self._start_warm()
        spans = self._spans
        if (
            need < end
            and spans is not None
            and not kept_whole(spans)
            and (spans.size >= PARTS_MIN_FACTOR * spans.capacity or shares_beyond_budget(spans))
        ):
            return self._decode_from_seek_point(start, end, need)
        return self._decode_from_seek_point(start, end)

    def _decode_from_seek_point(self, start: int, end: int, upto: Optional[int] = None) -> bytes:
        """The span ``[start, end)``, or its start up to ``upto``, by the backend's own means
        where it has them (``_decode_span_start``); else the whole span by a span decoder (which
        decodes whole chunks anyway)."""
        if self._closing:
            raise ValueError("I/O operation on a closed compressed file")  # (as the pools say)
        data = self._decode_span_start(start, end if upto is None else upto)
        if data is not None:
            return data
        return self._pread_direct(start, end - start, self._span_pool)

    def _span_starts_without_decoder(self) -> Optional[List[int]]:
        """The span starts, when the backend reads them from the stored seek points and decodes
        span-cache misses itself (``_decode_span_start``); None: a span decoder of the pool
        tells them when it is made (``_learn_spans``)."""
        return None

    def _make_spans(self, starts: Optional[List[int]], size: int) -> None:
        """The span cache, which counts the stream from now on (``count_before_reads``'s count
        is withdrawn)."""
        cache = optional_cache(starts, size, self.options.cache_size, self._transit)
        with self._pending_lock:
            self._spans = cache
            pending = self._pending if cache is not None else None
        if pending is not None:
            pending.withdraw()

    def serves_nested(self) -> None:
        with self._pending_lock:
            self._transit = True
            pending, self._pending = self._pending, None
        if pending is not None:
            pending.withdraw()
        self._drop_spans()  # (made anew, as a transit cache)

    def _drop_spans(self) -> None:
        """Forget the span cache (its stream no longer counts); the next read makes it again
        from the stored seek points."""
        with self._finish_lock, self._pending_lock:
            spans, self._spans, self._spans_asked = self._spans, None, False
        if spans is not None:
            spans.close()

    def count_before_reads(self) -> None:
        size = self._size
        if size is None or self.options.cache_size <= 0 or self._payload_loader is None or self._transit:
            return  # (not indexed yet: the first pass's end would make it count)
        with self._pending_lock:
            if self._spans is None and self._pending is None:
                self._pending = expect_stream(size)

    def _spans_of_seek_points(self) -> Optional[SpanCache]:
        """The span cache, made from the stored seek points without a decoder where the backend
        can (``_span_starts_without_decoder``): random reads of a .tar.gz then make no rapidgzip
        decoder at all, whose own cache of decoded chunks held 8-10 MiB each."""
        if not self._spans_asked:
            with self._finish_lock:
                if not self._spans_asked and self._spans is None and self.options.cache_size > 0:
                    starts = self._span_starts_without_decoder()
                    if starts is not None and self._size is not None:
                        self._make_spans(starts, self._size)
                self._spans_asked = True
        return self._spans

    def _decode_span_start(self, start: int, end: int) -> Optional[bytes]:
        """The bytes ``[start, end)`` from the seek point at ``start``, decoded without a library
        decoder of the pool and no further than ``end`` (None: the backend cannot). A decoder
        of the pool keeps decoded chunks of its own, which the span cache holds already."""
        return None

    # A stream whose decoded bytes all fit in the span cache (a .tar.gz of a few hundred MB of
    # small files does not; one of 30 MB does) is decoded whole, in order, in the background from
    # its first span miss on: random reads of its members soon find every span cached, instead
    # of each miss decoding its span alone and from a seek point (1,000 random reads of the
    # 10,000-file tar.gz decoded 85 spans so, most of their time). Only for the process's only
    # reader of this kind: in a union of many archives one would push out the others' spans.
    def _start_warm(self) -> None:
        with self._warm_lock:
            if self._warm is not None:
                return
            spans = self._spans
            size = self._size
            if spans is not None and size is not None and not self._closing and not self._transit:
                # (A transit stream is read by the decoders of the archives in it: decoded
                # whole into its few spans, it was decoded for nothing.)
                if size <= spans.capacity and len(_OPEN) == 1:
                    thread = threading.Thread(
                        target=self._warm_all, args=(spans, size), name="ratarmount-warm", daemon=True
                    )
                    self._warm = thread
                    logger.debug("%s: decoding all %d bytes into the span cache in the background", self.path, size)
                    # Started under the lock: close() takes it to find the thread to join, and
                    # joining one not yet started raised RuntimeError (a read's miss started it
                    # as the source closed: seen once, in a run of the whole suite under load).
                    thread.start()
                    return
                if kept_whole(spans):  # several streams kept whole, or one of up to three caches
                    job = self._warm = _WarmJob(self, spans, size)
                    logger.debug("%s: decoding all %d bytes into the span cache, in the queue", self.path, size)
                    _WARM_QUEUE.add(job)
                    return
            logger.debug(
                "%s: not decoded whole (spans %s, size %s, %d compressed readers open, closing: %s)",
                self.path, spans is not None, size, len(_OPEN), self._closing,
            )  # fmt: skip
            self._warm = False

    def decode_ahead(self) -> None:
        # The decoding of ``_start_warm`` begins at the first span-cache miss otherwise. A mount
        # is read a moment after it is up (a training job's first files come a few tens of ms
        # later): 1,000 random reads of the 10,000-file benchmark .tar.gz right after the mount
        # returned took 0.40-0.48 s from the first miss on and 0.28-0.31 s from the mount on,
        # with less CPU (misses no longer decode parts of spans that the whole-stream decoding
        # then decodes again).
        size = self._size
        if self._warm is not None or self._closing or size is None or self._payload_loader is None or self._transit:
            logger.debug(
                "%s: not decoded ahead (decoding %s, closing: %s, size %s, seek points stored: %s, transit: %s)",
                self.path, "refused" if self._warm is False else "started" if self._warm else "not begun",
                self._closing, size, self._payload_loader is not None, self._transit,
            )  # fmt: skip
            return
        if len(_OPEN) > 1 or size > self.options.cache_size:
            # With other streams, or larger than the cache: decoded in the queue of several
            # readers if the process keeps it whole (decided there, where the span cache is made).
            with self._warm_lock:
                if self._warm is not None or self._closing:
                    return
                job = self._warm = _WarmJob(self, None, size)
            logger.debug("%s: to be decoded ahead in the queue, if kept whole", self.path)
            _WARM_QUEUE.add(job)
            return
        with self._warm_lock:
            if self._starter is not None or self._closing:  # (close() sets the flag, then looks here)
                logger.debug("%s: not decoded ahead (asked before: %s)", self.path, self._starter is not None)
                return
            self._starter = threading.Thread(target=self._warm_now, name="ratarmount-warm-start", daemon=True)
            self._starter.start()

    def _warm_now(self) -> None:
        try:
            if self._spans_of_seek_points() is None and self._spans is None:
                self.pread(0, 1)  # the span starts come from a span decoder (bzip2): make one
            if self._spans is not None:
                self._start_warm()
            else:
                logger.debug("%s: not decoded ahead (no span starts known)", self.path)
        except Exception as exc:  # noqa: BLE001 - a hint: reads decode what they need themselves
            logger.debug("%s: no decoding ahead: %s", self.path, exc)

    def _warm_all(self, spans: SpanCache, size: int, pause: float = 0.0) -> None:
        # Span after span in order, as a miss decodes it (a span decoder of the pool goes on
        # where the last one ended, no seek): a span at a time holds no more than the cache will.
        # ``pause``: a sleep after each span decoded, which lets the threads that answer
        # requests have the GIL.
        try:
            for start, stop in spans.spans_within(0, size):
                if self._closing:
                    return
                if spans.wanted(start):
                    spans.offer(start, self._decode_from_seek_point(start, stop))
                    if pause:
                        time.sleep(pause)
        except Exception as exc:  # noqa: BLE001 - readers decode what they need themselves
            logger.debug("%s: decoding the whole stream ahead stopped: %s", self.path, exc)

    def _pread_direct(self, offset: int, size: int, pool: Optional[InstancePool[Any]] = None) -> bytes:
        with (pool or self._pool).acquire(offset, end=offset + size) as slot:
            decoder = slot.instance
            with self.data_errors():
                if slot.position != offset:
                    decoder.seek(offset)
                data = read_fully(decoder, size)
            slot.position = offset + len(data)
            if len(data) < size and not self._end_checked:
                self._ensure_finished(slot)  # at EOF: cheap, and detects a truncated stream
        return data

    @property
    def size(self) -> int:
        if self._size is not None:
            return self._size
        with self._pool.acquire(None) as slot:
            return self._ensure_finished(slot)

    def _use_seek_points(self, size: int, loader: Callable[[], bytes]) -> None:
        """Complete seek points (from the index, or made by a first pass elsewhere): decoders
        made from now on load them (``loader``), decoders made without them are dropped."""
        self._size = size
        self._end_checked = True
        self._payload_loader = loader
        for pool in self._pools():
            pool.retire_idle(lambda s: not s.complete)

    def export_seek_points(self, writer: SeekPointWriter) -> None:
        with self._pool.acquire(None) as slot:
            size = self._ensure_finished(slot)
            with self.data_errors():
                payload = self._export(slot.instance)
        header = {"size": size, "compressed_size": self.compressed_size}
        writer.put_seek_points(self.backend_name, pack_seek_points(header, payload))
        logger.debug("%s: stored %d bytes of %s seek points", self.path, len(payload), self.backend_name)
        # The first pass's decoders keep the chunks they decoded last (rapidgzip: up to the whole
        # of a small stream, ~15 MiB for one of 8 MB), and the pool keeps idle decoders: after
        # the first mount of a folder of 20 such .tar.gz the daemon held 322 MiB, a second mount
        # of it 31. Reads make their decoders from the stored seek points when they need them.
        for pool in self._pools():
            pool.retire_idle(lambda _slot: True)
        # The span cache made when the pass finished is empty, but its stream counts among those
        # that reads compete for (``spans.kept_whole``) from then on: the first mount of a union
        # of three copies of a 68 MB .tar.bz2 read only the last one (the others shadowed), not
        # kept whole, 300 random reads 8.9 s; a second mount, which makes each cache at the
        # archive's first read, 1.4 s. Made again at the first read, from the stored points.
        self._drop_spans()

    def import_seek_points(self, index: SeekPointSource) -> None:
        found = self._stored_seek_points(index)
        if found is None:
            return
        header, _payload = found
        name = self.backend_name

        def load() -> bytes:
            again = unpack_seek_points(index.seek_point_parts(name))
            if again is None:
                raise ValueError("seek points disappeared from the index")
            return again[1]

        self._use_seek_points(int(header["size"]), load)

    def close(self) -> None:
        self._closing = True
        _OPEN.discard(self)
        pending = self._pending
        if pending is not None:
            pending.withdraw()
        with self._warm_lock:
            starter = self._starter
        if starter is not None:
            # Before the decoders close: a bzip2 decoder it is still making or reading with
            # aborts the process if the interpreter ends under its threads (1 in 8 mounts
            # unmounted at once).
            starter.join(10)
        with self._warm_lock:  # (a thread found here has been started)
            warm = self._warm
        if isinstance(warm, threading.Thread):
            warm.join(10)  # (at most one span's decoding after the flag)
        elif isinstance(warm, _WarmJob):
            warm.cancel_or_wait(10)
        try:
            for pool in self._pools():
                pool.close()
            spans = self._spans
            if spans is not None:
                logger.debug(
                    "%s: %d decoders created, span cache %d hits / %d misses (%d bytes decoded into it)",
                    self.path,
                    self.stats.decoders_created,
                    spans.hits,
                    spans.misses,
                    spans.decoded_bytes,
                )
                spans.close()
        finally:
            super().close()
